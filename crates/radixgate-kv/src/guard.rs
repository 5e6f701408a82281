//! A size guard in front of each connection to a publisher.
//!
//! The ZMQ client reads a frame's declared length and sets room aside for
//! all of it before the first byte of its body arrives, and keeps every
//! frame of a message until the last one: a publisher that declares a
//! frame of 2^46 bytes (nine bytes on the wire) made the process abort on
//! the failed allocation, and one that never ends a message would fill
//! memory. The engines are the operator's, but a worker that lies, a
//! broken one, or whatever answers on a worker's port must never take the
//! router down.
//!
//! So the subscriber never connects its socket to the publisher itself.
//! For each connection [`Guarded::open`] dials the publisher, and the ZMQ
//! socket connects to a Unix socket of ours in a directory only this user
//! may enter, which takes a connection from this process only (the peer's
//! process id, as the kernel gives it); a task passes the bytes on both
//! ways, reading the publisher's side as ZMTP 3 frames ([`Frames`]: the
//! 64-byte greeting, then per frame its flags, its length and its body).
//! A frame, or a message's frames together, declared longer than the
//! limit ends the connection before anything of it is passed on, and
//! [`Guarded::oversized`] then says what was declared. The other way
//! (subscriptions, replay requests) is passed on as it is.
//!
//! What it costs: a task per connection, and one more read, write and
//! wake-up per message through the local socket: 7-20 µs a batch on 2
//! shared vCPUs, side by side with the subscriber before the guard
//! (`examples/subscribe_cost.rs`; docs/kv-events.md, "Size guard").

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;

/// The ZMTP 3 greeting's length.
const GREETING: usize = 64;
/// Frame flags: more frames follow, a long (8-byte) length, a command.
const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

/// Where the reading of a publisher's bytes stands.
#[derive(Debug, Clone, Copy)]
enum At {
    /// In the greeting, with this many bytes of it left.
    Greeting(usize),
    /// Before a frame's flags.
    Flags,
    /// In a frame's length: its flags, the bytes read and the value so far.
    Length { flags: u8, read: u8, value: u64 },
    /// In a frame's body, with this many bytes of it left.
    Body(u64),
}

/// A frame or message over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    /// The length declared: the frame's, or its message's so far.
    pub(crate) declared: u64,
    /// How many of the bytes fed come before the refused frame's header
    /// (all of them well-formed frames, to pass on).
    pub(crate) clean: usize,
}

/// Reads a publisher's side of a ZMTP 3 connection as frames, only for
/// their declared lengths.
#[derive(Debug)]
pub(crate) struct Frames {
    limit: u64,
    at: At,
    /// The lengths declared so far by the frames of the message under way.
    message: u64,
}

impl Frames {
    /// A reader for a connection's first byte on, that refuses frames and
    /// messages longer than `limit` bytes.
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit,
            at: At::Greeting(GREETING),
            message: 0,
        }
    }

    /// Reads the next bytes; refuses them as soon as a frame's length, or
    /// its message's so far, is over the limit.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), Refused> {
        let fed = bytes.len();
        // Where in `bytes` the current frame's header began (0 if before).
        let mut header = 0;
        while !bytes.is_empty() {
            match self.at {
                At::Greeting(left) => {
                    let n = left.min(bytes.len());
                    bytes = &bytes[n..];
                    self.at = if n == left {
                        At::Flags
                    } else {
                        At::Greeting(left - n)
                    };
                }
                At::Flags => {
                    header = fed - bytes.len();
                    let flags = bytes[0];
                    bytes = &bytes[1..];
                    self.at = At::Length {
                        flags,
                        read: 0,
                        value: 0,
                    };
                }
                At::Length { flags, read, value } => {
                    let value = (value << 8) | u64::from(bytes[0]);
                    bytes = &bytes[1..];
                    let read = read + 1;
                    let width = if flags & LONG != 0 { 8 } else { 1 };
                    if read < width {
                        self.at = At::Length { flags, read, value };
                    } else {
                        self.frame(flags, value).map_err(|declared| Refused {
                            declared,
                            clean: header,
                        })?;
                    }
                }
                At::Body(left) => {
                    let n = left.min(bytes.len() as u64);
                    bytes = &bytes[n as usize..];
                    self.at = if n == left {
                        At::Flags
                    } else {
                        At::Body(left - n)
                    };
                }
            }
        }
        Ok(())
    }

    /// A frame's header has been read: checks its length, and its
    /// message's, against the limit.
    fn frame(&mut self, flags: u8, length: u64) -> Result<(), u64> {
        let declared = if flags & COMMAND != 0 {
            length
        } else {
            self.message = self.message.saturating_add(length);
            let so_far = self.message;
            if flags & MORE == 0 {
                self.message = 0;
            }
            so_far
        };
        if declared > self.limit {
            return Err(declared);
        }
        self.at = if length == 0 {
            At::Flags
        } else {
            At::Body(length)
        };
        Ok(())
    }
}

/// Why [`Guarded::open`] could not give a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unopened {
    /// The publisher could not be reached in time.
    Unreachable,
    /// No directory would take the local socket (`$XDG_RUNTIME_DIR`,
    /// `$TMPDIR` or `/tmp`, `/dev/shm`).
    NoLocalSocket,
}

/// One connection to a publisher, behind the guard; see the module doc.
/// Dropping it ends the connection and removes the local socket.
pub(crate) struct Guarded {
    endpoint: String,
    dir: PathBuf,
    oversized: Arc<OnceLock<u64>>,
    task: JoinHandle<()>,
}

impl Guarded {
    /// Dials `remote` (`tcp://HOST:PORT` or `ipc://PATH`) within `timeout`
    /// and opens the local socket for the ZMQ socket to connect to.
    pub(crate) async fn open(
        remote: &str,
        timeout: Duration,
        limit: u64,
    ) -> Result<Self, Unopened> {
        let Ok(Some(publisher)) = tokio::time::timeout(timeout, dial(remote)).await else {
            return Err(Unopened::Unreachable);
        };
        let (dir, listener) = local_socket().ok_or(Unopened::NoLocalSocket)?;
        let path = dir.join("s");
        let oversized = Arc::new(OnceLock::new());
        let task = tokio::spawn(pass(
            listener,
            path.clone(),
            publisher,
            timeout,
            limit,
            oversized.clone(),
        ));
        Ok(Self {
            endpoint: format!("ipc://{}", path.display()),
            dir,
            oversized,
            task,
        })
    }

    /// Where the ZMQ socket connects.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The length the publisher declared over the limit, if the connection
    /// ended for that.
    pub(crate) fn oversized(&self) -> Option<u64> {
        self.oversized.get().copied()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(self.dir.join("s"));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The publisher's side of a connection.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

async fn dial(remote: &str) -> Option<Box<dyn Stream>> {
    if let Some(address) = remote.strip_prefix("tcp://") {
        Some(Box::new(connect_tcp(address).await?))
    } else {
        let path = remote.strip_prefix("ipc://")?;
        Some(Box::new(UnixStream::connect(path).await.ok()?))
    }
}

/// A TCP connection to a publisher at `address`, with its options.
async fn connect_tcp(address: &str) -> Option<TcpStream> {
    let stream = TcpStream::connect(address).await.ok()?;
    let _ = stream.set_nodelay(true);
    keep_alive(&stream);
    Some(stream)
}

/// How long a publisher's connection may stay silent before the kernel
/// asks the other end whether it is still there, how often it asks, and
/// how many unanswered asks end the connection: a publisher's host that
/// died or rebooted without a word is noticed within about a minute.
const KEEPALIVE: (Duration, Duration, u32) = (Duration::from_secs(30), Duration::from_secs(10), 3);

/// Turns TCP keepalive on for `stream`. A SUB sends nothing once
/// subscribed, so without it a connection to a host that vanished (no
/// reset ever comes) looks open forever: its worker's stream stayed live
/// on an index of blocks long gone, and after the host came back its
/// engine's new publisher was never heard. An engine idle for long sends
/// nothing either; its host answers the probes.
fn keep_alive(stream: &TcpStream) {
    let (idle, interval, retries) = KEEPALIVE;
    let probes = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval)
        .with_retries(retries);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&probes);
}

/// A new directory that only this user may enter, and the local socket
/// bound in it as `s`. Tried in `$XDG_RUNTIME_DIR`, the temporary
/// directory, then `/dev/shm`, which stays writable in a container whose
/// root file system is read-only (the chart's default).
fn local_socket() -> Option<(PathBuf, UnixListener)> {
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let bases = [
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        Some(std::env::temp_dir()),
        Some(PathBuf::from("/tmp")),
        Some(PathBuf::from("/dev/shm")),
    ];
    // A Unix socket's path has room for about 100 bytes.
    for base in bases
        .into_iter()
        .flatten()
        .filter(|b| b.as_os_str().len() <= 60)
    {
        for _ in 0..4 {
            // Not to be guessed: a name made in advance by someone else
            // would only make this try fail, but would cost a try.
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
            let dir = base.join(format!(
                "radixgate-kv-{}-{:016x}",
                std::process::id(),
                hasher.finish()
            ));
            // Fails where the name is taken: never a directory someone
            // else made.
            if std::fs::DirBuilder::new().mode(0o700).create(&dir).is_err() {
                continue;
            }
            match UnixListener::bind(dir.join("s")) {
                Ok(listener) => return Some((dir, listener)),
                Err(_) => {
                    let _ = std::fs::remove_dir(&dir);
                    break;
                }
            }
        }
    }
    None
}

/// Takes the ZMQ socket's one connection (within `timeout`), then passes
/// bytes both ways until either side ends or the publisher declares too
/// much.
async fn pass(
    listener: UnixListener,
    path: PathBuf,
    publisher: Box<dyn Stream>,
    timeout: Duration,
    limit: u64,
    oversized: Arc<OnceLock<u64>>,
) {
    // Only this process's own connection is taken (its peer's process id,
    // from the kernel), whatever the directory's permissions.
    let ours = |stream: &UnixStream| {
        stream
            .peer_cred()
            .is_ok_and(|cred| cred.pid() == i32::try_from(std::process::id()).ok())
    };
    let accepted = tokio::time::timeout(timeout, async {
        loop {
            match listener.accept().await {
                Ok((stream, _)) if ours(&stream) => return Some(stream),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    })
    .await;
    let _ = std::fs::remove_file(&path);
    drop(listener);
    let Ok(Some(local)) = accepted else {
        return;
    };
    let (mut from_local, mut to_local) = local.into_split();
    let (mut from_publisher, mut to_publisher) = tokio::io::split(publisher);
    let upstream = tokio::io::copy(&mut from_local, &mut to_publisher);
    let downstream = async {
        let mut frames = Frames::new(limit);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_publisher.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Err(refused) = frames.feed(&buf[..n]) {
                // What came before it is passed on; the connection ends
                // there, so a header begun in an earlier read stays cut.
                let _ = to_local.write_all(&buf[..refused.clean]).await;
                let _ = oversized.set(refused.declared);
                return;
            }
            if to_local.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = upstream => {}
        () = downstream => {}
    }
}

#[cfg(test)]
mod tests;
