//! A real `nats-server` for the sync tests: started on a free loopback
//! port with JetStream and a store directory of its own, stopped by PID.
//! A missing `nats-server` binary fails the test (`.ci/run` installs it).

#![allow(dead_code, unreachable_pub)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One nats-server process; dropped: killed and its store removed.
pub struct Nats {
    pub port: u16,
    pub dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A fresh directory under the system's temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "radixgate-sync-{tag}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Nats {
    /// Starts `nats-server -js` with `extra` arguments on a free port.
    pub fn start(extra: &[&str]) -> Self {
        // Port 0: the server picks one as it binds (one picked free
        // beforehand may be another test's by then), and says which.
        let mut nats = Self {
            port: 0,
            dir: temp_dir("nats"),
            args: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        nats.launch();
        nats
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn launch(&mut self) {
        let port = match self.port {
            0 => "-1".to_owned(),
            port => port.to_string(),
        };
        let ports = self.dir.join("ports");
        let _ = std::fs::remove_dir_all(&ports);
        std::fs::create_dir_all(&ports).unwrap();
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port, "-js", "-sd"])
            .arg(self.dir.join("store"))
            .arg("--ports_file_dir")
            .arg(&ports)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "nats-server must be installed (apt-get install nats-server); .ci/run installs it",
            );
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        // The ports file, `{"nats":["nats://127.0.0.1:PORT"]}`, is written
        // once the server listens.
        self.port = loop {
            let written = std::fs::read_dir(&ports).ok().and_then(|mut entries| {
                entries.find_map(|e| {
                    let path = e.ok()?.path();
                    let name = path.file_name()?.to_str()?.to_owned();
                    name.ends_with(&format!("_{pid}.ports"))
                        .then(|| std::fs::read_to_string(&path).ok())
                        .flatten()
                })
            });
            let port = written.and_then(|text| {
                let (_, after) = text.split_once("127.0.0.1:")?;
                after.split('"').next()?.parse::<u16>().ok()
            });
            if let Some(port) = port {
                break port;
            }
            if let Some(exit) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("nats-server exited before it listened: {exit}");
            }
            assert!(
                Instant::now() < deadline,
                "nats-server wrote no ports file in {}",
                ports.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (by its PID) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Has the server read its config file again, as an operator's edit
    /// would (`nats-server --signal reload=PID`).
    pub fn reload(&self) {
        let pid = self.child.as_ref().expect("nats-server runs").id();
        let status = Command::new("nats-server")
            .args(["--signal", &format!("reload={pid}")])
            .status()
            .unwrap();
        assert!(status.success(), "nats-server --signal reload: {status}");
    }

    /// Starts it again on the same port with its store gone, as a server
    /// replaced by a new one: its streams start again from sequence 1.
    pub fn restart_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.dir.join("store"));
        self.launch();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `openssl ARGS` in `dir`; panics with its error output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A throwaway CA and a server certificate for 127.0.0.1, made with the
/// `openssl` command; returns (ca.pem, server.pem, server.key).
pub fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=radixgate test CA",
        ],
    );
    let (server, key) = signed(
        dir,
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1",
    );
    (dir.join("ca.pem"), server, key)
}

/// A client certificate signed by the CA [`tls_files`] made in `dir`;
/// returns (client.pem, client.key).
pub fn client_cert(dir: &Path) -> (PathBuf, PathBuf) {
    signed(
        dir,
        "client",
        "/CN=radixgate replica",
        "extendedKeyUsage=clientAuth",
    )
}

/// A key and a certificate for `subject` with the extension `ext`, signed
/// by the CA in `dir`: (NAME.pem, NAME.key).
fn signed(dir: &Path, name: &str, subject: &str, ext: &str) -> (PathBuf, PathBuf) {
    let file = |suffix: &str| format!("{name}.{suffix}");
    std::fs::write(dir.join(file("cnf")), format!("{ext}\n")).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &file("key"),
            "-out",
            &file("csr"),
            "-subj",
            subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &file("csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &file("pem"),
            "-days",
            "1",
            "-extfile",
            &file("cnf"),
        ],
    );
    (dir.join(file("pem")), dir.join(file("key")))
}

/// A TCP proxy on loopback in front of a NATS server, for a network
/// partition: [`Partition::freeze`] stops it passing bytes either way while
/// every connection stays open (as a cable pulled between switches: no
/// FIN, no RST, writes pile up in buffers); [`Partition::heal`] drops the
/// connections it froze, as a partition that outlived the client's
/// pings ends, and passes bytes again for new ones. [`Partition::slow`]
/// makes it a slow link instead: each chunk waits before it passes. Its
/// tasks run on the test's runtime.
pub struct Partition {
    pub port: u16,
    frozen: tokio::sync::watch::Sender<bool>,
    delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Partition {
    /// Starts passing connections on a free loopback port to `nats`.
    pub async fn in_front_of(nats: &Nats) -> Self {
        Self::start(&format!("127.0.0.1:{}", nats.port)).await
    }

    /// Starts passing connections on a free loopback port to `upstream`
    /// (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (frozen, thawed) = tokio::sync::watch::channel(false);
        let delay = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let slow = delay.clone();
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let upstream = upstream.to_owned();
        let held = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let mut held = held.lock().unwrap();
                held.push(tokio::spawn(pump(cr, sw, thawed.clone(), slow.clone())));
                held.push(tokio::spawn(pump(sr, cw, thawed.clone(), slow.clone())));
            }
        });
        Self {
            port,
            frozen,
            delay,
            conns,
            accept,
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Holds every chunk `by` before passing it on, both ways (a slow or
    /// congested link; zero: as fast as loopback).
    pub fn slow(&self, by: std::time::Duration) {
        self.delay
            .store(by.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Stops passing bytes; connections stay open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Drops every connection so far and passes bytes again.
    pub fn heal(&self) {
        for task in self.conns.lock().unwrap().drain(..) {
            task.abort();
        }
        self.frozen.send_replace(false);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.accept.abort();
        for task in self.conns.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// Copies `from` to `to` while not frozen: a frozen pump neither reads
/// nor writes, so what is sent meanwhile waits in the kernel's buffers.
/// Each chunk waits `delay` milliseconds first.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut thawed: tokio::sync::watch::Receiver<bool>,
    delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if thawed.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let wait = delay.load(std::sync::atomic::Ordering::Relaxed);
        if wait > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
        if thawed.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A NATS server in operator mode (JWTs, a memory resolver) with one
/// account, JetStream on; returns its config file's text and the `.creds`
/// text of a user of that account. The JWTs are signed here with nkeys as
/// NATS signs them: `header.claims.signature`, base64url, ed25519.
pub fn operator_mode() -> (String, String) {
    use nkeys::KeyPair;
    let b64 = |bytes: &[u8]| data_encoding::BASE64URL_NOPAD.encode(bytes);
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let jwt = |issuer: &KeyPair, subject: &str, name: &str, nats: serde_json::Value| {
        let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
        let claims = serde_json::json!({
            "jti": format!("{:032X}", rand::random::<u128>()),
            "iat": iat,
            "iss": issuer.public_key(),
            "name": name,
            "sub": subject,
            "nats": nats,
        });
        let body = b64(claims.to_string().as_bytes());
        let signed = format!("{header}.{body}");
        let sig = issuer.sign(signed.as_bytes()).unwrap();
        format!("{signed}.{}", b64(&sig))
    };
    let operator = KeyPair::new_operator();
    let account = KeyPair::new_account();
    let system = KeyPair::new_account();
    let user = KeyPair::new_user();
    let op_jwt = jwt(
        &operator,
        &operator.public_key(),
        "test operator",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
        "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let acc_jwt = jwt(
        &operator,
        &account.public_key(),
        "routers",
        serde_json::json!({"type": "account", "version": 2, "limits": unlimited}),
    );
    let sys_jwt = jwt(
        &operator,
        &system.public_key(),
        "system",
        serde_json::json!({"type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "router",
        serde_json::json!({
            "type": "user", "version": 2, "pub": {}, "sub": {},
            "subs": -1, "data": -1, "payload": -1,
        }),
    );
    let conf = format!(
        "operator: \"{op_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\nresolver_preload: {{\n  {acc}: \"{acc_jwt}\"\n  {sys}: \"{sys_jwt}\"\n}}\n",
        sys = system.public_key(),
        acc = account.public_key(),
    );
    let creds = format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().unwrap()
    );
    (conf, creds)
}
