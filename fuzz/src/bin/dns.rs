//! AFL++ target `dns`: see `sluice_fuzz::dns` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::dns(data));
}
