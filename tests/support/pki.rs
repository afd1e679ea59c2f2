//! Test certificates made with rcgen at test time: a CA, server
//! certificates with IP and DNS SANs, and client certificates for the
//! static key fixtures (PKCS#1, PKCS#8, SEC1) under `fixtures/kubeconfig/keys/`.
//! ring cannot generate RSA keys, which is why those keys are files.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A throwaway certificate authority.
pub struct Pki {
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = params.self_signed(&ca_key).expect("CA certificate");
        Pki { ca_pem: ca_cert.pem(), issuer: Issuer::new(params, ca_key) }
    }

    /// A server certificate for `names` (IP strings become IP SANs).
    pub fn server(&self, names: &[&str]) -> CertAndKey {
        let key = KeyPair::generate().expect("server key");
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("server certificate");
        CertAndKey { cert_pem: cert.pem(), key_pem: key.serialize_pem(), cert_der: cert.der().to_vec() }
    }

    /// A client certificate (CN = user, O = group) for a fresh P-256 key.
    pub fn client(&self, user: &str) -> CertAndKey {
        let key = KeyPair::generate().expect("client key");
        let cert = self.client_cert_for(user, &key);
        CertAndKey { key_pem: key.serialize_pem(), ..cert }
    }

    /// A client certificate for a fixture key. `key_pem` is what the
    /// kubeconfig gets; `pkcs8_pem` is the same key in the form rcgen reads.
    pub fn client_for_fixture(&self, user: &str, key_pem: &str, pkcs8_pem: &str) -> CertAndKey {
        let key = KeyPair::from_pem(pkcs8_pem).expect("fixture key");
        let cert = self.client_cert_for(user, &key);
        CertAndKey { key_pem: key_pem.to_string(), ..cert }
    }

    fn client_cert_for(&self, user: &str, key: &KeyPair) -> CertAndKey {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, user);
        params.distinguished_name.push(DnType::OrganizationName, "system:masters");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(key, &self.issuer).expect("client certificate");
        CertAndKey { cert_pem: cert.pem(), key_pem: String::new(), cert_der: cert.der().to_vec() }
    }
}

/// A key fixture's text.
pub fn key_fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kubeconfig/keys").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}
