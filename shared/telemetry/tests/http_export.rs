//! The HTTP/protobuf exporter starts inside a tokio runtime, exports on flush and stops on
//! drop without blocking the runtime (its blocking client lives on its own thread).

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_posted_to_v1_traces_over_http() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (request_line, received) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buffer = vec![0_u8; 64 * 1024];
        let read = stream.read(&mut buffer).await.unwrap();
        let head = String::from_utf8_lossy(&buffer[..read]).to_string();
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        let _ = request_line.send(head.lines().next().unwrap_or_default().to_owned());
    });
    let guard = telemetry::init(
        "palisade-telemetry-test",
        &telemetry::TelemetrySettings {
            json: false,
            default_filter: "warn".into(),
            otlp: Some(telemetry::OtlpSettings {
                protocol: telemetry::OtlpProtocol::HttpProtobuf,
                endpoint: Some(format!("http://{addr}/v1/traces")),
            }),
            to_stderr: false,
            flush_timeout: None,
        },
    )
    .unwrap();
    tracing::info_span!("exported").in_scope(|| {});
    guard.flush().await;
    let line = tokio::time::timeout(std::time::Duration::from_secs(10), received)
        .await
        .expect("the exporter posted within 10 s")
        .unwrap();
    assert_eq!(line, "POST /v1/traces HTTP/1.1");
    drop(guard);
}
