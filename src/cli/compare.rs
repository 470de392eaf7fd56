//! `sluice compare`: two timing files (or directories of batches) side by side.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

pub(crate) const AFTER_HELP: &str =
    "A directory is one batch per file (name order); a single file is cut into \
batches of --batch-size records. Prints count, median and P95 of connect, first byte and total for \
each input, the paired difference of medians by batch with a 95% bootstrap confidence interval \
(5,000 resamples, fixed seed), the ratio of medians, and two clusters instead of one median where \
a distribution has two.\n\nExample:\n  sluice compare direct.csv proxied.csv --plot compare.svg";

#[derive(Debug, Args)]
pub(crate) struct CompareArgs {
    /// The baseline (e.g. direct) timing file or directory.
    pub(crate) a: PathBuf,
    /// The other (e.g. proxied) timing file or directory.
    pub(crate) b: PathBuf,
    /// Print the numbers as CSV instead of a table.
    #[arg(long)]
    pub(crate) csv: bool,
    /// Also draw the two distributions side by side into FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Records per batch when an input is a single file.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub(crate) batch_size: usize,
}

pub(crate) fn execute(args: CompareArgs) -> anyhow::Result<i32> {
    let batch_size = args.batch_size.max(1);
    // The errors name the file that could not be read.
    let left = crate::timing::load_input(&args.a, batch_size)?;
    let right = crate::timing::load_input(&args.b, batch_size)?;
    let comparison = crate::timing::compare(&left, &right);
    if args.csv {
        print!("{}", comparison.render_csv());
    } else {
        print!("{}", comparison.render_table());
    }
    if let Some(svg) = args.plot.as_deref() {
        crate::timing::plot_svg(&left, &right, svg)
            .with_context(|| format!("cannot draw {}", svg.display()))?;
        eprintln!("wrote {}", svg.display());
    }
    Ok(0)
}
