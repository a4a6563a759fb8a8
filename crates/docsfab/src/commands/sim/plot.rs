//! The `sim goodput --sweep --plot` chart: a small hand-written SVG (two series over one x
//! axis), so no plotting crate is needed for two polylines.

use docsfab_goodput::report::Summary;

const W: f64 = 640.0;
const H: f64 = 360.0;
const PAD: f64 = 56.0;

/// Step success (left axis, %) and p99 step time (right axis, s) against the swept value.
pub fn svg(key: &str, xs: &[u64], rows: &[Summary]) -> String {
    let (x_lo, x_hi) = (
        xs.first().copied().unwrap_or(0) as f64,
        xs.last().copied().unwrap_or(1) as f64,
    );
    let x_of = |x: f64| PAD + (x - x_lo) / (x_hi - x_lo).max(1.0) * (W - 2.0 * PAD);
    let succ: Vec<f64> = rows.iter().map(|r| r.success_rate * 100.0).collect();
    let p99: Vec<f64> = rows.iter().map(|r| r.p99_step_ms as f64 / 1000.0).collect();
    let s_lo = succ.iter().copied().fold(100.0, f64::min).min(99.0).floor();
    let p_hi = p99.iter().copied().fold(1.0, f64::max);
    let y_s = |v: f64| H - PAD - (v - s_lo) / (100.0 - s_lo).max(1e-9) * (H - 2.0 * PAD);
    let y_p = |v: f64| H - PAD - v / p_hi * (H - 2.0 * PAD);
    let line = |ys: &[f64], f: &dyn Fn(f64) -> f64| {
        xs.iter()
            .zip(ys)
            .map(|(x, y)| format!("{:.1},{:.1}", x_of(*x as f64), f(*y)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{r}\" y1=\"{PAD}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <text x=\"{cx}\" y=\"{xl}\" text-anchor=\"middle\">{key}</text>\n\
         <text x=\"{PAD}\" y=\"{tl}\" fill=\"#1f77b4\">step success % ({s_lo:.0}..100)</text>\n\
         <text x=\"{r}\" y=\"{tl}\" text-anchor=\"end\" fill=\"#d62728\">p99 step time s (0..{p_hi:.0})</text>\n",
        b = H - PAD,
        r = W - PAD,
        cx = W / 2.0,
        xl = H - PAD / 3.0,
        tl = PAD - 12.0,
    );
    for x in xs {
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{x}</text>\n",
            x_of(*x as f64),
            H - PAD + 16.0
        ));
    }
    out.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"{}\"/>\n\
         <polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"6 3\" points=\"{}\"/>\n</svg>\n",
        line(&succ, &y_s),
        line(&p99, &y_p)
    ));
    out
}
