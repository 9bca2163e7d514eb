//! moto in server mode: a real implementation of the CloudWatch API on a free loopback port,
//! and boto3 (from the same venv) as a separate client that reads back what arrived.

use std::{
    net::TcpStream,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{free_port, wait_until, Proc};

/// moto_server from `cargo xtask setup`'s venv (the deploy validators'), else from PATH; the
/// python3 beside it has boto3 (a dependency of moto).
fn moto_server() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    let venv = PathBuf::from(home).join(".local/share/health-agent/deploy-tools/bin/moto_server");
    if venv.is_file() {
        return venv;
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("moto_server"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("moto_server is not installed: run `cargo xtask setup` (it installs moto[server] from PyPI)")
        })
}

/// The venv's python3, which has boto3 and botocore.
pub fn python() -> PathBuf {
    moto_server().with_file_name("python3")
}

/// A moto server (all services; the tests use CloudWatch). Stopped on drop.
pub struct Moto {
    pub port: u16,
    python: PathBuf,
    _child: Proc,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Moto {
    pub fn start() -> Self {
        let server = moto_server();
        // boto3 beside moto_server: the same venv.
        let python = server.with_file_name("python3");
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("moto.log");
        let port = free_port();
        let child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("moto log"))
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("moto log"),
            ))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", server.display()));
        let moto = Self {
            port,
            python,
            _child: Proc(child),
            log,
            _dir: dir,
        };
        wait_until(Duration::from_secs(30), "moto to listen", || {
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        moto
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Everything moto holds under `namespace` in `region`, read with boto3:
    /// `{"metrics": ListMetrics, "datapoints": GetMetricStatistics of each metric}`.
    pub fn read_back(&self, region: &str, namespace: &str) -> Value {
        let script = r#"
import json, sys, datetime, boto3
endpoint, region, namespace = sys.argv[1:4]
cw = boto3.client("cloudwatch", endpoint_url=endpoint, region_name=region,
                  aws_access_key_id="reader", aws_secret_access_key="reader")
now = datetime.datetime.now(datetime.timezone.utc)
out = {"metrics": [], "datapoints": []}
for m in cw.list_metrics(Namespace=namespace)["Metrics"]:
    out["metrics"].append(m)
    for unit in ("Percent", "None"):
        r = cw.get_metric_statistics(
            Namespace=namespace, MetricName=m["MetricName"], Dimensions=m["Dimensions"],
            StartTime=now - datetime.timedelta(hours=1), EndTime=now + datetime.timedelta(hours=1),
            Period=3600, Statistics=["SampleCount", "Sum", "Average", "Minimum", "Maximum"],
            Unit=unit)
        for d in r["Datapoints"]:
            d.pop("Timestamp", None)
            d["MetricName"] = m["MetricName"]
            d["QueriedUnit"] = unit
            out["datapoints"].append(d)
print(json.dumps(out))
"#;
        let out = Command::new(&self.python)
            .args(["-c", script, &self.endpoint(), region, namespace])
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .output()
            .expect("running boto3");
        assert!(
            out.status.success(),
            "boto3 read-back failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "boto3 printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}
