//! dns (in progress)
