//! AFL++ target `peek`: see `sluice_fuzz::peek` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::peek(data));
}
