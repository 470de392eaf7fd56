//! AFL++ target `policy`: see `sluice_fuzz::policy` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::policy(data));
}
