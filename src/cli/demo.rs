//! `sluice demo`: sluice at work on a throwaway topology.

pub(crate) fn execute() -> anyhow::Result<i32> {
    crate::demo::run()
}
