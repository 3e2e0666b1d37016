//! `inferscope install-shim DIR`: copies the CUPTI shim from the image onto a host path, so GPU
//! pods load it (CUDA_INJECTION64_PATH) without rebuilding their image. The DaemonSet's init
//! container runs it; the image has no shell to do it with `cp`.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use tracing::info;

#[derive(Args)]
pub(super) struct InstallShimArgs {
    /// Directory to place libinferscope_cupti.so in (a host path shared with engine pods).
    pub dir: PathBuf,
    /// The shim to copy.
    #[arg(long, default_value = "/usr/lib/inferscope/libinferscope_cupti.so")]
    pub from: PathBuf,
}

pub(super) fn run(args: InstallShimArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let target = args.dir.join("libinferscope_cupti.so");
    // Copy beside, then rename: an engine starting meanwhile maps the old file or the new one,
    // never a half-written one.
    let partial = args.dir.join(".libinferscope_cupti.so.partial");
    std::fs::copy(&args.from, &partial).with_context(|| {
        format!(
            "copying {} to {} failed",
            args.from.display(),
            partial.display()
        )
    })?;
    std::fs::rename(&partial, &target)
        .with_context(|| format!("renaming to {} failed", target.display()))?;
    info!(path = %target.display(), "CUPTI shim installed: set CUDA_INJECTION64_PATH to it in engine pods");
    Ok(())
}
