//! Certificates made at test time with the openssl CLI: a private CA and the server and client
//! certificates it signs (EC P-256, valid two days), in a temporary directory removed on drop.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::succeed;

/// A CA of the test's own.
pub struct Ca {
    dir: tempfile::TempDir,
    /// The CA certificate (PEM): what a client is given as `sslrootcert`.
    pub cert: PathBuf,
    key: PathBuf,
}

/// A certificate the CA signed, and its key.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) {
    succeed(Command::new("openssl").args(args).current_dir(dir));
}

/// `openssl req` with `how` (`-x509 …` for a self-signed certificate, `-new` for a request):
/// a new P-256 key to `key`, and `out`, for subject CN `cn`.
fn new_key(dir: &Path, how: &[&str], cn: &str, key: &Path, out: &Path) {
    let subject = format!("/CN={cn}");
    let mut args = vec!["req"];
    args.extend_from_slice(how);
    args.extend([
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ]);
    args.extend([
        "-keyout",
        path_str(key),
        "-out",
        path_str(out),
        "-subj",
        &subject,
    ]);
    openssl(&args, dir);
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

impl Ca {
    /// A self-signed CA named `name` (its subject CN).
    pub fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        let ca = [
            "-x509",
            "-days",
            "2",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ];
        new_key(dir.path(), &ca, name, &key, &cert);
        Self { dir, cert, key }
    }

    /// A server certificate for `names` (`DNS:localhost`, `IP:127.0.0.1`), subject CN `cn`.
    pub fn server(&self, cn: &str, names: &[&str]) -> Issued {
        self.issue(
            cn,
            &format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
                names.join(",")
            ),
        )
    }

    /// A client certificate for database user `user` (PostgreSQL's `cert` authentication maps
    /// the subject CN to the user).
    pub fn client(&self, user: &str) -> Issued {
        self.issue(
            user,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
        )
    }

    fn issue(&self, cn: &str, extensions: &str) -> Issued {
        let d = self.dir.path();
        let stem: String = cn
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let (cert, key, csr, ext) = (
            d.join(format!("{stem}.crt")),
            d.join(format!("{stem}.key")),
            d.join(format!("{stem}.csr")),
            d.join(format!("{stem}.ext")),
        );
        std::fs::write(&ext, extensions).expect("writing the extensions file");
        new_key(d, &["-new"], cn, &key, &csr);
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                path_str(&csr),
                "-CA",
                path_str(&self.cert),
                "-CAkey",
                path_str(&self.key),
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                path_str(&cert),
                "-extfile",
                path_str(&ext),
            ],
            d,
        );
        Issued { cert, key }
    }
}
