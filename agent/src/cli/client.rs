//! Connecting to a running agent's gRPC API (`inferscope run`), for `top`, `inspect` and `export`.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use hyper_util::rt::TokioIo;
use inferscope_proto::v1::agent::inferscope_client::InferscopeClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Uri};

pub(super) const DEFAULT_CONNECT: &str = "unix:///run/inferscope/agent.sock";

#[derive(Args, Debug, Clone)]
pub(super) struct ConnectArgs {
    /// The agent's gRPC address: unix:///path, http://host:port or https://host:port.
    #[arg(
        long,
        env = "INFERSCOPE_CONNECT",
        default_value = DEFAULT_CONNECT
    )]
    pub connect: String,
    /// CA certificate (PEM) that signed the agent's certificate, for https://.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
}

impl ConnectArgs {
    pub(super) async fn client(&self) -> anyhow::Result<InferscopeClient<Channel>> {
        let hint = "is `inferscope run` running, and is this its --grpc address? (pass --connect)";
        let channel = if let Some(path) = self.connect.strip_prefix("unix://") {
            let path = PathBuf::from(path);
            // The URI is required by the API but unused: the connector dials the socket.
            Endpoint::try_from("http://agent.invalid")?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .with_context(|| format!("cannot connect to {}; {hint}", self.connect))?
        } else {
            let mut endpoint = Endpoint::from_shared(self.connect.clone())
                .with_context(|| format!("bad address {:?}", self.connect))?;
            if let Some(ca) = &self.tls_ca {
                let pem =
                    std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
                endpoint = endpoint
                    .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
                    .context("the CA certificate is not usable")?;
            } else if self.connect.starts_with("https://") {
                // No CA given: trust the public web PKI roots.
                endpoint = endpoint
                    .tls_config(ClientTlsConfig::new().with_webpki_roots())
                    .context("setting up TLS failed")?;
            }
            endpoint
                .connect()
                .await
                .with_context(|| format!("cannot connect to {}; {hint}", self.connect))?
        };
        Ok(InferscopeClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
    }
}

pub(super) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime failed")
}
