//! AFL++ target `dns_upstream`: see `sluice_fuzz::dns_upstream` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| sluice_fuzz::dns_upstream(data));
}
