//! Certificates for tests that run servers with TLS: a certificate authority of the test's
//! own, a server certificate for 127.0.0.1 and localhost, and a client certificate, written
//! as PEM files into a directory the test keeps.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// PEM files of one test authority and the certificates it signed.
#[derive(Debug)]
pub struct TestCertificates {
    /// The authority's certificate: what clients trust.
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TestCertificates {
    /// Generates a fresh authority and its certificates into `dir`. Keys are written 0600.
    pub fn generate(dir: &Path) -> Self {
        Self::generate_for(dir, &[])
    }

    /// [`TestCertificates::generate`], the server's certificate naming `addresses` too (a
    /// server on the suite's network).
    pub fn generate_for(dir: &Path, addresses: &[std::net::Ipv4Addr]) -> Self {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "palisade test authority");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("a key");
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .expect("a self-signed authority");
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf = |names: Vec<String>, purpose: ExtendedKeyUsagePurpose, common_name: &str| {
            let mut params = CertificateParams::new(names).expect("valid names");
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![purpose];
            let key = KeyPair::generate().expect("a key");
            let cert = params.signed_by(&key, &issuer).expect("signed");
            (cert.pem(), key.serialize_pem())
        };
        let mut names: Vec<String> = vec!["127.0.0.1".into(), "localhost".into()];
        names.extend(addresses.iter().map(ToString::to_string));
        let (server_cert, server_key) =
            leaf(names, ExtendedKeyUsagePurpose::ServerAuth, "localhost");
        let (client_cert, client_key) = leaf(
            vec!["palisade-test-client".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
            "palisade-test-client",
        );

        let write = |name: &str, text: &str, secret: bool| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("certificate written");
            if secret {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .expect("key made private");
            }
            path
        };
        Self {
            ca: write("ca.pem", &ca_cert.pem(), false),
            server_cert: write("server.pem", &server_cert, false),
            server_key: write("server-key.pem", &server_key, true),
            client_cert: write("client.pem", &client_cert, false),
            client_key: write("client-key.pem", &client_key, true),
        }
    }
}
