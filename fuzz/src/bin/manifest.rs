//! AFL++ target `manifest`: see `sluice_fuzz::manifest` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::manifest(data));
}
