//! `docsfab sim goodput --fault-model store` over real runs against `docsfab sim serve`: the
//! model is fitted from the figures `runs stats` reports, too few runs is refused (exit 2), and
//! `doctor` prints the expected step success once the store holds enough runs.

mod support;

use support::run::{FAST_CATALOG, ONE_STEP, Setup, Sim};

/// Run 1 meets 503, 503 then answers; run 2 answers at once; run 3 meets one 503. Three bursts
/// of faults (2, 0 and 1 long): two bursts over three faults give badToGood 2/3, and two bursts
/// over the three clean requests give goodToBad 2/3; every fault was a 503.
#[test]
fn issue14_goodput_store_model_is_fitted_from_recorded_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        tmp.path(),
        "responses:
  - status: 503
  - status: 503
  - answer: {json: {modules: [lib]}}
  - answer: {json: {modules: [lib]}}
  - status: 503
  - answer: {json: {modules: [lib]}}
",
    );
    let s = Setup::new(&sim.base_url, FAST_CATALOG);
    let comp = s.composition(ONE_STEP);
    let goodput = || {
        s.docsfab()
            .args([
                "sim",
                "goodput",
                "--fault-model",
                "store",
                "--policy",
                "effective",
            ])
            .args(["--steps", "200", "--json"])
            .output()
            .unwrap()
    };
    let doctor = || {
        let out = s.docsfab().arg("doctor").output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    for i in 0..3 {
        if i == 2 {
            assert!(!doctor().contains("Expected step success"));
            let early = goodput();
            let err = String::from_utf8_lossy(&early.stderr);
            assert_eq!(early.status.code(), Some(2), "{err}");
            assert!(err.contains("needs at least 3 recorded runs"), "{err}");
        }
        let out = s.run_command(&comp).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = goodput();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &doc["model"];
    let third = |v: &serde_json::Value| (v.as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9;
    assert!(third(&m["badToGood"]) && third(&m["goodToBad"]), "{m}");
    assert_eq!(m["bad"]["server"], 1.0);
    assert_eq!(doc["policies"][0]["steps"], 200);
}
