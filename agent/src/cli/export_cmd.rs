//! `inferscope export --perfetto FILE`: recent requests from a running agent, with their steps
//! and kernels, as a trace ui.perfetto.dev opens.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use inferscope_proto::v1::agent::{GetRequestRequest, ListRequestsRequest};

use super::client::{ConnectArgs, runtime};
use crate::export::perfetto;

#[derive(Args, Debug)]
pub(super) struct ExportArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Write Chrome trace-event JSON (open it in ui.perfetto.dev) to this file.
    #[arg(long)]
    pub perfetto: PathBuf,
    /// The most recent requests to include.
    #[arg(long, default_value_t = 200)]
    pub limit: u32,
    /// Only requests at least this slow to their first token.
    #[arg(long, default_value_t = 0.0)]
    pub min_ttft_ms: f64,
}

pub(super) fn run(args: ExportArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let mut client = args.connect.client().await?;
        let list = client
            .list_requests(ListRequestsRequest {
                limit: args.limit,
                min_ttft_ms: args.min_ttft_ms,
                ..Default::default()
            })
            .await
            .context("listing requests failed")?
            .into_inner();
        let mut timelines = Vec::with_capacity(list.requests.len());
        // Oldest first, so tracks appear in arrival order.
        for r in list.requests.iter().rev() {
            match client
                .get_request(GetRequestRequest {
                    request_id: r.request_id.clone(),
                })
                .await
            {
                Ok(t) => timelines.push(t.into_inner()),
                // Evicted from the agent's window between the two calls.
                Err(s) if s.code() == tonic::Code::NotFound => {}
                Err(s) => return Err(s).context("fetching a request failed"),
            }
        }
        let trace = perfetto::trace(&timelines);
        let file = std::fs::File::create(&args.perfetto)
            .with_context(|| format!("cannot create {}", args.perfetto.display()))?;
        serde_json::to_writer(std::io::BufWriter::new(file), &trace)
            .with_context(|| format!("writing {} failed", args.perfetto.display()))?;
        eprintln!(
            "wrote {} requests to {} (open it in https://ui.perfetto.dev)",
            timelines.len(),
            args.perfetto.display()
        );
        Ok(())
    })
}
