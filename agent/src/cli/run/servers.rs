//! The daemon's listeners: the Prometheus endpoint and the gRPC API.
use std::{
    os::unix::fs::PermissionsExt as _,
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use inferscope_proto::v1::agent::inferscope_server::InferscopeServer;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tracing::{error, info};

use super::config::{GrpcAddr, RunConfig};
use crate::{
    capture::process::sockpath::{self, Bound},
    diagnose::history::History,
    export::{grpc::ApiService, health::Health, hub::Hub, metrics::Metrics, prometheus_http},
};

pub(super) fn start_prometheus(
    runtime: &tokio::runtime::Handle,
    config: &RunConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> anyhow::Result<()> {
    if let Some(addr) = config.prometheus {
        let listener = runtime
            .block_on(prometheus_http::bind(addr))
            .with_context(|| {
                format!("cannot listen on {addr} for Prometheus; pass --prometheus ADDR or off")
            })?;
        info!(%addr, "serving Prometheus metrics at /metrics (probes: /healthz, /readyz)");
        runtime.spawn(async move {
            if let Err(e) = prometheus_http::serve(listener, metrics, Some(health)).await {
                error!("the Prometheus endpoint stopped: {e}");
            }
        });
    }
    Ok(())
}

pub(super) fn start_grpc(
    runtime: &tokio::runtime::Handle,
    config: &RunConfig,
    hub: Arc<Hub>,
    history: Option<Arc<Mutex<History>>>,
) -> anyhow::Result<Option<Bound>> {
    let mut bound = None;
    let service = InferscopeServer::new(ApiService::new(hub, history));
    match &config.grpc {
        GrpcAddr::Off => {}
        GrpcAddr::Unix(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            // A stale socket of ours is replaced; a live one (another agent: `run` waits for it
            // to exit before it gets here) or anything else at the path is not touched.
            sockpath::claim(path).context("cannot serve the gRPC API; pass --grpc")?;
            let listener = {
                let _runtime = runtime.enter();
                tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("cannot listen on {}; pass --grpc", path.display()))?
            };
            bound = Bound::new(path);
            // The API shows request metadata: root only.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("cannot restrict {}", path.display()))?;
            info!(path = %path.display(), "serving the gRPC API");
            runtime.spawn(async move {
                if let Err(e) = Server::builder()
                    .add_service(service)
                    .serve_with_incoming(UnixListenerStream::new(listener))
                    .await
                {
                    error!("the gRPC API stopped: {e}");
                }
            });
        }
        GrpcAddr::Tcp(addr) => {
            let mut builder = Server::builder();
            if let Some((cert, key)) = &config.grpc_tls {
                let cert = std::fs::read(cert)
                    .with_context(|| format!("cannot read {}", cert.display()))?;
                let key =
                    std::fs::read(key).with_context(|| format!("cannot read {}", key.display()))?;
                builder = builder
                    .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
                    .context("the gRPC TLS certificate or key is not usable")?;
            }
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind(addr))
                .with_context(|| format!("cannot listen on {addr} for gRPC; pass --grpc"))?;
            info!(%addr, tls = config.grpc_tls.is_some(), "serving the gRPC API");
            runtime.spawn(async move {
                if let Err(e) = builder
                    .add_service(service)
                    .serve_with_incoming(TcpListenerStream::new(listener))
                    .await
                {
                    error!("the gRPC API stopped: {e}");
                }
            });
        }
    }
    Ok(bound)
}
