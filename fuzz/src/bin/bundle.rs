//! AFL++ target `bundle`: see `sluice_fuzz::bundle` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::bundle(data));
}
