use super::*;

/// A frame as a publisher writes it: flags, a short or long length, body.
fn frame(flags: u8, body_len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    if body_len > 255 {
        out.push(flags | LONG);
        out.extend((body_len as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body_len as u8);
    }
    out.extend(std::iter::repeat_n(0xAB, body_len));
    out
}

/// A long frame header declaring `length`, without its body.
fn long_header(flags: u8, length: u64) -> Vec<u8> {
    let mut out = vec![flags | LONG];
    out.extend(length.to_be_bytes());
    out
}

fn greeting() -> Vec<u8> {
    let mut g = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 1];
    g.resize(GREETING, 0);
    g
}

/// Feeds `bytes` in pieces of `piece` bytes; the first refusal's declared
/// length, if any.
fn feed_in_pieces(limit: u64, bytes: &[u8], piece: usize) -> Result<(), u64> {
    let mut frames = Frames::new(limit);
    for chunk in bytes.chunks(piece) {
        frames.feed(chunk).map_err(|r| r.declared)?;
    }
    Ok(())
}

/// A connection's opening and one published message of three frames.
fn conversation(payload: usize) -> Vec<u8> {
    let mut bytes = greeting();
    bytes.extend(frame(COMMAND, 25)); // READY
    bytes.extend(frame(MORE, 9)); // topic
    bytes.extend(frame(MORE, 8)); // sequence
    bytes.extend(frame(0, payload)); // payload
    bytes
}

#[test]
fn frames_within_the_limit_pass_however_the_bytes_are_split() {
    let bytes = conversation(1_000);
    for piece in [1, 2, 3, 7, 64, 65, 1024, bytes.len()] {
        assert_eq!(
            feed_in_pieces(1_017, &bytes, piece),
            Ok(()),
            "piece {piece}"
        );
    }
}

#[test]
fn a_frame_declared_over_the_limit_is_refused_at_its_header() {
    let mut bytes = greeting();
    bytes.extend(long_header(0, 1 << 46));
    for piece in [1, 5, bytes.len()] {
        assert_eq!(feed_in_pieces(1 << 20, &bytes, piece), Err(1 << 46));
    }
    // One byte over.
    let mut bytes = greeting();
    bytes.extend(frame(0, 301));
    assert_eq!(feed_in_pieces(300, &bytes, 1), Err(301));
    assert_eq!(feed_in_pieces(301, &bytes, 1), Ok(()));
}

#[test]
fn a_message_counts_all_its_frames_and_starts_again_after_the_last() {
    // Three frames of 100 bytes: 300 in all.
    let mut message = Vec::new();
    message.extend(frame(MORE, 100));
    message.extend(frame(MORE, 100));
    message.extend(frame(0, 100));
    let mut bytes = greeting();
    bytes.extend(&message);
    assert_eq!(feed_in_pieces(299, &bytes, 3), Err(300));
    // Within the limit, message after message: each counts on its own.
    for _ in 0..10 {
        bytes.extend(&message);
    }
    assert_eq!(feed_in_pieces(300, &bytes, 3), Ok(()));
    // A message that never ends is refused once its frames add up.
    let mut endless = greeting();
    for _ in 0..10 {
        endless.extend(frame(MORE, 100));
    }
    assert_eq!(feed_in_pieces(550, &endless, 64), Err(600));
}

#[test]
fn commands_are_held_to_the_limit_on_their_own() {
    let mut bytes = greeting();
    bytes.extend(frame(MORE, 200));
    bytes.extend(frame(COMMAND, 200)); // does not add to the message
    bytes.extend(frame(0, 100));
    assert_eq!(feed_in_pieces(300, &bytes, 1), Ok(()));
    let mut bytes = greeting();
    bytes.extend(long_header(COMMAND, 1 << 40));
    assert_eq!(feed_in_pieces(300, &bytes, 1), Err(1 << 40));
}

#[test]
fn empty_frames_and_the_greeting_alone_are_read_through() {
    let mut bytes = greeting();
    assert_eq!(feed_in_pieces(0, &bytes, 1), Ok(()));
    bytes.extend(frame(MORE, 0));
    bytes.extend(frame(0, 0));
    assert_eq!(feed_in_pieces(0, &bytes, 1), Ok(()));
}

#[test]
fn what_comes_before_a_refused_frame_is_clean() {
    let mut bytes = greeting();
    bytes.extend(frame(MORE, 10));
    bytes.extend(frame(0, 20));
    let before = bytes.len();
    bytes.extend(long_header(0, 1 << 30));
    bytes.extend(frame(0, 5));
    let refused = Frames::new(1 << 20).feed(&bytes).unwrap_err();
    assert_eq!(
        refused,
        Refused {
            declared: 1 << 30,
            clean: before
        }
    );
    // A header begun in an earlier piece: nothing of this one is clean.
    let mut frames = Frames::new(1 << 20);
    frames.feed(&bytes[..before + 3]).unwrap();
    let refused = frames.feed(&bytes[before + 3..]).unwrap_err();
    assert_eq!(refused.clean, 0);
}

#[tokio::test]
async fn the_local_socket_takes_this_process_only() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The publisher: sends a greeting to whoever the guard lets through.
    let publisher = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let remote = format!("tcp://{}", publisher.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut stream, _) = publisher.accept().await.unwrap();
        stream.write_all(&greeting()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let guarded = Guarded::open(&remote, Duration::from_secs(5), 1 << 20)
        .await
        .unwrap();
    let path = guarded
        .endpoint()
        .strip_prefix("ipc://")
        .unwrap()
        .to_owned();
    // The directory is this user's alone.
    let dir = std::path::Path::new(&path).parent().unwrap();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700);
    // Another process connects first, and holds its connection.
    let mut other = std::process::Command::new("python3")
        .args([
            "-c",
            "import socket, sys, time\n\
             s = socket.socket(socket.AF_UNIX)\n\
             s.connect(sys.argv[1])\n\
             print('connected', flush=True)\n\
             time.sleep(10)",
            &path,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(other.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "connected");
    // This process's connection is the one passed on.
    let mut ours = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut got = vec![0u8; GREETING];
    tokio::time::timeout(Duration::from_secs(5), ours.read_exact(&mut got))
        .await
        .expect("the publisher's bytes within 5 s")
        .unwrap();
    assert_eq!(got, greeting());
    let _ = other.kill();
    let _ = other.wait();
    drop(guarded);
    assert!(!dir.exists(), "the directory goes with the connection");
}

/// A publisher's TCP connection is probed once silent: a host that
/// vanished without a reset is noticed.
#[tokio::test]
async fn a_publishers_connection_has_keepalive() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let stream = connect_tcp(&address).await.expect("connects");
    let socket = socket2::SockRef::from(&stream);
    let (idle, interval, retries) = KEEPALIVE;
    assert!(socket.keepalive().unwrap());
    assert_eq!(socket.tcp_keepalive_time().unwrap(), idle);
    assert_eq!(socket.tcp_keepalive_interval().unwrap(), interval);
    assert_eq!(socket.tcp_keepalive_retries().unwrap(), retries);
    assert!(socket.tcp_nodelay().unwrap());
}
