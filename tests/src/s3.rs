//! A real S3-compatible server for the tests: moto's `moto_server` (installed by
//! `host/cluster/install-test-s3.sh`, which `.ci/setup` runs), started on a free loopback
//! port, killed when dropped, with a bucket made and the `AWS_*` settings that point a
//! client at it. moto honours `If-None-Match: *` on PUT, so create-only writes are real.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `moto_server` in `$STATEBOX_S3_VENV` (default `~/.cache/statebox/s3-venv`).
pub fn moto_server_bin() -> PathBuf {
    let venv = std::env::var_os("STATEBOX_S3_VENV").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/statebox/s3-venv")
        },
        PathBuf::from,
    );
    let bin = venv.join("bin/moto_server");
    assert!(
        bin.is_file(),
        "the test S3 server is missing at {}: run host/cluster/install-test-s3.sh (.ci/setup does)",
        bin.display()
    );
    bin
}

/// A moto S3 server on 127.0.0.1, killed on drop.
pub struct S3 {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Its log file.
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl S3 {
    /// Starts a server on a free port and waits until it answers HTTP.
    pub fn start() -> S3 {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
            l.local_addr().expect("local address").port()
        };
        let addr = format!("127.0.0.1:{port}");
        let dir = tempfile::Builder::new()
            .prefix("statebox-moto-")
            .tempdir()
            .expect("temporary directory");
        let log = dir.path().join("moto.log");
        let out = std::fs::File::create(&log).expect("server log");
        let child = Command::new(moto_server_bin())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("server log"))
            .stderr(out)
            .spawn()
            .expect("start moto_server");
        let mut server = S3 {
            child,
            addr,
            log,
            _dir: dir,
        };
        // Python starts in a second or two; a busy machine can take much longer.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if matches!(server.request("GET", "/"), Ok((200, _))) {
                break;
            }
            let exited = server.child.try_wait().expect("poll moto_server");
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "moto_server did not answer on {} (exit status {exited:?}); its log:\n{}",
                server.addr,
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// One plain HTTP/1.1 request: the status code and the response.
    fn request(&self, method: &str, path: &str) -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect(&self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.addr
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let response = String::from_utf8_lossy(&raw).into_owned();
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {response:?}")))?;
        Ok((status, response))
    }

    /// Creates a bucket (moto takes an unsigned `PUT /<bucket>`).
    pub fn create_bucket(&self, bucket: &str) {
        let (status, response) = self
            .request("PUT", &format!("/{bucket}"))
            .expect("create a bucket");
        assert_eq!(status, 200, "PUT /{bucket}: {response}");
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `AWS_*` settings that point an S3 client at this server: for
    /// `StateStore::open_with`, or as the environment of a `statebox` process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", "statebox-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "statebox-test".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
