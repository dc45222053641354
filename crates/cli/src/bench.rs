//! `spillway bench datapath` (being written).

/// Arguments of `spillway bench datapath`.
#[derive(clap::Args, Debug)]
pub struct DatapathArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Run the data-path benchmark.
pub fn datapath(_args: &DatapathArgs) -> anyhow::Result<()> {
    anyhow::bail!("not written yet")
}
