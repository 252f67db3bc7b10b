//! A certificate authority made by the test, and server certificates it signs, so TLS
//! is tested against local endpoints (Azurite over HTTPS, PostgreSQL with `ssl=on`, the
//! Service Bus stand-in over AMQPS) the way a deployment meets Azure: the client must
//! verify the server, and trusts the CA only because it was told to.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// A test CA; its files live in a scratch directory removed on drop.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
}

/// A server certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct ServerCert {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("orderly test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a self-signed CA");
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("orderly-test-ca-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the CA's directory");
        let ca = Self { issuer, dir };
        std::fs::write(ca.ca_file(), ca.ca_pem()).expect("the CA file");
        ca
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate's file (what a client is told to trust).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The directory holding the CA's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A server certificate for `names` (DNS names or IP addresses), signed by this CA,
    /// written as `<file_stem>.crt` / `<file_stem>.key`.
    pub fn server_cert(&self, file_stem: &str, names: &[&str]) -> ServerCert {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server params");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("server"),
        );
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("a server key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a server certificate");
        let out = ServerCert {
            cert: self.dir.join(format!("{file_stem}.crt")),
            key: self.dir.join(format!("{file_stem}.key")),
        };
        std::fs::write(&out.cert, cert.pem()).expect("the server certificate");
        std::fs::write(&out.key, key.serialize_pem()).expect("the server key");
        out
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
