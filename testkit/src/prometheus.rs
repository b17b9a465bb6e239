//! Reading what a Prometheus exporter renders, for the tests that check jobguard's metrics.

use std::collections::BTreeMap;

/// The `# TYPE` lines, metric name to kind. Panics on a name typed twice: an exporter that
/// renders one metric under two families has a naming bug (`_total_total`, a counter and a gauge
/// of one name).
pub fn types(rendered: &str) -> BTreeMap<&str, &str> {
    let mut types = BTreeMap::new();
    for line in rendered.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("`# TYPE name kind`");
            assert!(
                types.insert(name, kind).is_none(),
                "{name} typed twice:\n{rendered}"
            );
        }
    }
    types
}

/// The sample lines, `name{labels}` to value.
pub fn samples(rendered: &str) -> BTreeMap<&str, &str> {
    rendered
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').expect("`name{labels} value`"))
        .collect()
}
