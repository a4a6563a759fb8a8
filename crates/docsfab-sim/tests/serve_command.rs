//! `serve_command` end to end in its own test binary, because it ends on a signal sent to the
//! whole process.

mod support;

use std::time::Duration;

use support::*;

#[tokio::test]
async fn serve_command_serves_logs_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.yaml");
    std::fs::write(
        &scenario,
        "responses:\n  - status: 503\n  - answer: {text: hi}\n",
    )
    .unwrap();
    let log = dir.path().join("log.jsonl");
    // A free port: bind, note it, release it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    let (s, l) = (scenario.clone(), log.clone());
    let served = tokio::spawn(async move { docsfab_sim::serve_command(addr, &s, Some(&l)).await });
    let mut up = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(up, "the server came up on {addr}");
    // The probe connection above sent nothing, so the script is untouched.
    assert_eq!(
        send(addr, CHAT, &openai_body("m", true))
            .await
            .parsed()
            .status,
        503
    );
    assert_eq!(
        send(addr, CHAT, &openai_body("m", true))
            .await
            .parsed()
            .status,
        200
    );

    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let result = tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("stops promptly");
    result.unwrap().expect("a clean stop");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer listening"
    );
    let lines = std::fs::read_to_string(&log).unwrap();
    assert_eq!(lines.lines().count(), 2);
}
