//! Builds the ureq `Agent` for one cluster: roots, client certificate,
//! `insecure-skip-tls-verify`, `tls-server-name`, proxy and timeouts.
//!
//! PEM material is checked here before ureq sees it, because ureq panics on a
//! client key rustls cannot use (`with_client_auth_cert(..).expect(..)`): a
//! key of an unsupported type, or one that does not match the certificate,
//! becomes a `kube::Error::Config` instead.
//!
//! `tls-server-name`: ureq takes the SNI and the name it verifies from the
//! URL host and has no setting for either. We use the documented workaround
//! from kubernetes-api.md §9: requests go to `https://<tls-server-name>:<port>`
//! and a resolver pins that name to the real server's address. The apiserver
//! ignores the Host header. This is on ureq's `unversioned` API, so a ureq
//! upgrade may need a look here. A proxy would be handed the wrong host, so
//! `tls-server-name` together with `proxy-url` is refused, and proxy
//! environment variables are not used for such a cluster.

use std::sync::Arc;
use std::time::Duration;

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use crate::kube::Error;
use crate::kube::watch::StreamConnector;

/// Everything that decides how connections are made, fixed per cluster.
#[derive(Clone, Debug)]
pub struct ConnectionSettings {
    /// The server URL from the kubeconfig (`https://host:port`).
    pub server: String,
    pub tls_server_name: Option<String>,
    pub insecure_skip_tls_verify: bool,
    /// Parsed once; `None` means the built-in web PKI roots.
    pub roots: Option<Vec<Certificate<'static>>>,
    pub proxy_url: Option<String>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

impl ConnectionSettings {
    /// The base URL requests are sent to: the server, or the server with
    /// its host replaced by `tls-server-name` (see the module comment).
    pub fn base_url(&self) -> Result<String, Error> {
        let Some(server_name) = &self.tls_server_name else {
            return Ok(self.server.clone());
        };
        let (_, port) = split_server(&self.server)?;
        Ok(format!("https://{server_name}:{port}"))
    }
}

/// Parses a CA bundle; bundles may hold several certificates.
pub fn parse_roots(pem: &[u8], origin: &str) -> Result<Vec<Certificate<'static>>, Error> {
    let mut roots = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::Certificate(certificate)) => roots.push(certificate),
            Ok(_) => {}
            Err(error) => return Err(Error::Config(format!("{origin} is not valid PEM: {error}"))),
        }
    }
    if roots.is_empty() {
        return Err(Error::Config(format!("{origin} holds no PEM certificate")));
    }
    Ok(roots)
}

/// Parses and checks a client certificate chain and key (PKCS#1, PKCS#8 or
/// SEC1). The key must be one rustls' ring provider can sign with, and must
/// belong to the first certificate.
pub fn client_cert(certificate_pem: &[u8], key_pem: &[u8], origin: &str) -> Result<ClientCert, Error> {
    let mut chain = Vec::new();
    for item in ureq::tls::parse_pem(certificate_pem) {
        match item {
            Ok(PemItem::Certificate(certificate)) => chain.push(certificate),
            Ok(_) => {}
            Err(error) => {
                return Err(Error::Config(format!("client certificate of {origin} is not valid PEM: {error}")));
            }
        }
    }
    if chain.is_empty() {
        return Err(Error::Config(format!("client certificate of {origin} holds no PEM certificate")));
    }
    let key = PrivateKey::from_pem(key_pem).map_err(|_| {
        Error::Config(format!(
            "client key of {origin} holds no PEM private key; expected `RSA PRIVATE KEY`, `PRIVATE KEY` or `EC PRIVATE KEY`"
        ))
    })?;
    check_key_pair(&chain, key_pem, origin)?;
    Ok(ClientCert::new_with_certs(&chain, key))
}

/// What each open connection holds to read and to write (see `agent`).
const INPUT_BUFFER: usize = 16 << 10;
pub const OUTPUT_BUFFER: usize = 32 << 10;

/// Builds the agent. `client_cert` is the kubeconfig's, or one an exec
/// plugin returned.
pub fn agent(settings: &ConnectionSettings, client_cert: Option<ClientCert>) -> Result<ureq::Agent, Error> {
    build(settings, client_cert, Use::Calls)
}

/// Builds the agent for streams (watches, followed logs): it keeps no idle
/// connection, so each stream connects anew through `StreamConnector`,
/// which lets its `Abort` close that connection alone (see `kube::watch`).
pub fn stream_agent(settings: &ConnectionSettings, client_cert: Option<ClientCert>) -> Result<ureq::Agent, Error> {
    build(settings, client_cert, Use::Streams)
}

/// What an agent is for.
#[derive(Clone, Copy, PartialEq)]
enum Use {
    Calls,
    Streams,
}

fn build(settings: &ConnectionSettings, client_cert: Option<ClientCert>, used_for: Use) -> Result<ureq::Agent, Error> {
    let mut tls = TlsConfig::builder()
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .client_cert(client_cert);
    if settings.insecure_skip_tls_verify {
        tls = tls.disable_verification(true);
    } else if let Some(roots) = &settings.roots {
        tls = tls.root_certs(RootCerts::new_with_certs(roots));
    }
    let proxy = match (&settings.proxy_url, &settings.tls_server_name) {
        (Some(_), Some(_)) => {
            return Err(Error::Config("tls-server-name together with proxy-url is not supported; remove one of them".to_string()));
        }
        (Some(url), None) => {
            Some(ureq::Proxy::new(url).map_err(|error| Error::Config(format!("proxy-url `{url}` is not usable: {error}")))?)
        }
        (None, Some(_)) => None,
        // Like client-go: HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY.
        (None, None) => ureq::Proxy::try_from_env(),
    };
    let config = ureq::Agent::config_builder()
        .tls_config(tls.build())
        .proxy(proxy)
        // 4xx/5xx come back as responses so their Status bodies can be read.
        .http_status_as_error(false)
        // The apiserver does not redirect; never follow one with credentials.
        .max_redirects(0)
        .max_redirects_will_error(false)
        .user_agent(concat!("mcp-k8s-ephemeral-job/", env!("CARGO_PKG_VERSION")))
        .timeout_connect(Some(settings.connect_timeout))
        .timeout_per_read(Some(settings.read_timeout))
        .timeout_per_write(Some(settings.read_timeout))
        // ureq's 128 KiB in and 128 KiB out are held per open connection,
        // and every run following its log holds one (256 calls in flight
        // held 64 MiB in buffers alone at those sizes, 24 MiB at 64 and 32
        // KiB). A TLS record holds at most 16 KiB, so a larger input buffer
        // saves no read, and it grows for a longer response head (up to
        // ureq's 64 KiB cap on it); a request head, credentials included,
        // must fit the output buffer, 32 KiB.
        .input_buffer_size(INPUT_BUFFER)
        .output_buffer_size(OUTPUT_BUFFER)
        // Runs make their API calls from their own threads; with ureq's
        // default of 3 idle connections per host, most calls under load
        // paid a new TLS handshake. 25 is client-go's own choice.
        // A stream's connection is never reused: it ends aborted or read
        // to its end, and the next stream must connect through
        // `StreamConnector` to be abortable.
        .max_idle_connections(if used_for == Use::Streams { 0 } else { 25 })
        .max_idle_connections_per_host(if used_for == Use::Streams { 0 } else { 25 })
        .build();
    let resolver = match &settings.tls_server_name {
        Some(server_name) => {
            let (host, port) = split_server(&settings.server)?;
            Some(PinnedResolver { server_name: server_name.clone(), real_authority: format!("{host}:{port}") })
        }
        None => None,
    };
    Ok(match (used_for, resolver) {
        (Use::Calls, None) => config.into(),
        (Use::Calls, Some(resolver)) => ureq::Agent::with_parts(config, DefaultConnector::new(), resolver),
        (Use::Streams, None) => ureq::Agent::with_parts(config, StreamConnector::default(), DefaultResolver::default()),
        (Use::Streams, Some(resolver)) => ureq::Agent::with_parts(config, StreamConnector::default(), resolver),
    })
}

/// Resolves `server_name` to the real server's addresses (see module comment).
#[derive(Debug)]
struct PinnedResolver {
    server_name: String,
    real_authority: String,
}

impl Resolver for PinnedResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        if uri.host() != Some(self.server_name.as_str()) {
            return DefaultResolver::default().resolve(uri, config, timeout);
        }
        let real: ureq::http::Uri =
            format!("https://{}/", self.real_authority).parse().map_err(|_| ureq::Error::BadUri(self.real_authority.clone()))?;
        DefaultResolver::default().resolve(&real, config, timeout)
    }
}

/// `https://host:port` → (host, port); the port defaults to 443. IPv6 hosts
/// keep their brackets.
fn split_server(server: &str) -> Result<(String, u16), Error> {
    let uri: ureq::http::Uri = server.parse().map_err(|_| Error::Config(format!("server `{server}` is not a URL")))?;
    let Some(authority) = uri.authority() else {
        return Err(Error::Config(format!("server `{server}` has no host")));
    };
    let port = authority.port_u16().unwrap_or(443);
    Ok((authority.host().to_string(), port))
}

fn check_key_pair(chain: &[Certificate<'static>], key_pem: &[u8], origin: &str) -> Result<(), Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let key_der =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| Error::Config(format!("client key of {origin} is not usable: {error}")))?;
    let chain_der = chain.iter().map(|certificate| CertificateDer::from(certificate.der().to_vec())).collect();
    let provider = rustls::crypto::ring::default_provider();
    match rustls::sign::CertifiedKey::from_der(chain_der, key_der, &provider) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => Err(Error::Config(format!(
            "client key of {origin} does not match its client certificate; check client-key and client-certificate"
        ))),
        Err(error) => {
            Err(Error::Config(format!("client key of {origin} is not usable: {error}; supported: RSA, ECDSA P-256/P-384, Ed25519")))
        }
    }
}
