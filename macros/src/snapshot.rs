//! Expansion snapshots: what `cargo expand` shows a user, checked in under `tests/expand/` so
//! that a change to it shows up in review.
//!
//! Each case runs [`crate::expand::attribute`] on a representative function, pretty-prints the
//! result with `prettyplease` and compares it with `tests/expand/<name>.expanded.rs`. After an
//! intended change, rewrite the files and read their diff:
//!
//! ```text
//! JOBGUARD_BLESS=1 cargo test -p jobguard-macros snapshot
//! ```
//!
//! The README's "What the attributes expand to" is the `idempotent_retry` case, written between
//! the `<!-- expansion:begin -->` and `<!-- expansion:end -->` markers by the same test, which
//! fails when the README differs.

use crate::expand::{self, Kind};
use proc_macro2::TokenStream;
use std::path::PathBuf;

/// One representative input: the attribute that expands, its arguments, and the function.
struct Case {
    name: &'static str,
    kind: Kind,
    args: &'static str,
    item: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "charge",
        kind: Kind::Retry,
        args: r#"attempts = 5, base = "500ms", cap = "8s", on = transient"#,
        item: r#"
            /// Captures the order's payment.
            pub async fn charge(order_id: &str, amount: u64) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, amount).await
            }
        "#,
    },
    Case {
        name: "method",
        kind: Kind::Retry,
        args: r#"attempts = 3, jitter = none"#,
        item: r#"
            async fn refund(&self, order_id: &str) -> Result<(), GatewayError> {
                let receipt = self.receipts.get(order_id).ok_or(GatewayError::Unknown)?;
                self.gateway.refund(receipt).await
            }
        "#,
    },
    Case {
        name: "guarded",
        kind: Kind::Retry,
        args: r#"attempts = 4, timeout = "2s", breaker = GATEWAY, dead_letter = DEAD_LETTERS"#,
        item: r#"
            async fn capture(order_id: &str) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, 100).await
            }
        "#,
    },
    Case {
        name: "on_ok",
        kind: Kind::Retry,
        args: r#"attempts = 3, on_ok = unavailable, name = "http.fetch""#,
        item: r#"
            async fn fetch(url: &str) -> Result<Response, HttpError> {
                client().get(url).await
            }
        "#,
    },
    Case {
        name: "idempotent_crashes",
        kind: Kind::Idempotent,
        args: r#"key = job.id, lease = "2s", crashes = 5"#,
        item: r#"
            async fn effect(job: Job) -> Result<u64, Error> {
                downstream().write(job.id, jobguard::fence()).await
            }
        "#,
    },
    Case {
        name: "transaction",
        kind: Kind::Idempotent,
        args: r#"key = transfer.id, transaction = tx"#,
        item: r#"
            async fn transfer(tx: &mut PgConnection, transfer: &Transfer) -> Result<i64, LedgerError> {
                debit(&mut *tx, transfer).await?;
                credit(&mut *tx, transfer).await
            }
        "#,
    },
    Case {
        name: "transaction_retry",
        kind: Kind::Idempotent,
        args: r#"key = transfer.id, transaction = tx"#,
        item: r#"
            #[retry(attempts = 3, timeout = "2s")]
            async fn transfer(tx: &mut PgConnection, transfer: &Transfer) -> Result<i64, LedgerError> {
                debit(&mut *tx, transfer).await?;
                credit(&mut *tx, transfer).await
            }
        "#,
    },
    Case {
        name: "idempotent_retry",
        kind: Kind::Idempotent,
        args: r#"key = order_id"#,
        item: r#"
            #[retry(attempts = 5, base = "500ms", cap = "8s", jitter = none)]
            async fn charge(order_id: &str, amount: u64) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, amount).await
            }
        "#,
    },
    Case {
        name: "breaker",
        kind: Kind::Retry,
        args: r#"attempts = 5, breaker = GATEWAY"#,
        item: r#"
            async fn capture(order_id: &str) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, 100).await
            }
        "#,
    },
    Case {
        name: "retry_budget",
        kind: Kind::Retry,
        args: r#"attempts = 3, breaker = GATEWAY, retry_budget = GATEWAY_RETRIES"#,
        item: r#"
            async fn capture(order_id: &str) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, 100).await
            }
        "#,
    },
    Case {
        name: "timeout",
        kind: Kind::Retry,
        args: r#"attempts = 3, timeout = "2s""#,
        item: r#"
            async fn capture(order_id: &str) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, 100).await
            }
        "#,
    },
    Case {
        name: "idempotent_retry_sink",
        kind: Kind::Idempotent,
        args: r#"key = order_id, crashes = 2"#,
        item: r#"
            #[retry(attempts = 3, dead_letter = *JOB_LETTERS)]
            async fn charge(order_id: &str) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, 100).await
            }
        "#,
    },
    Case {
        name: "idempotent_retry_payload",
        kind: Kind::Idempotent,
        args: r#"key = order_id"#,
        item: r#"
            #[retry(attempts = 3, payload = (order_id, amount))]
            async fn charge(order_id: &str, amount: u64) -> Result<Receipt, GatewayError> {
                gateway().capture(order_id, amount).await
            }
        "#,
    },
    Case {
        name: "step",
        kind: Kind::Step,
        args: r#"name = "capture.v1""#,
        item: r#"
            async fn capture(order: &Order) -> Result<Payment, GatewayError> {
                gateway().capture(&order.id, order.amount).await
            }
        "#,
    },
];

fn tokens(text: &str) -> TokenStream {
    text.parse().expect("the case is valid Rust tokens")
}

/// Pretty-prints a token stream that holds items.
fn pretty(tokens: TokenStream) -> String {
    match syn::parse2::<syn::File>(tokens.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        // Not items (it should always be): show the raw tokens so the diff still says something.
        Err(e) => format!("// does not parse as items: {e}\n{tokens}\n"),
    }
}

/// The checked-in text for a case: a header naming the input, then the expansion.
fn render(case: &Case) -> String {
    let attribute = match case.kind {
        Kind::Retry => "retry",
        Kind::Idempotent => "idempotent",
        Kind::Step => "step",
    };
    let input = format!("#[{attribute}({})]\n{}", case.args, case.item.trim());
    let input = pretty(tokens(&input));
    let output = pretty(written_back(expand::attribute(
        case.kind,
        tokens(case.args),
        tokens(case.item),
    )));
    let mut text = String::from(
        "// The expansion of the input below, as `cargo expand` shows it.\n\
         // Generated by macros/src/snapshot.rs: rewrite with\n\
         // `JOBGUARD_BLESS=1 cargo test -p jobguard-macros snapshot`, then read the diff.\n\
         //\n\
         // Input:\n",
    );
    for line in input.lines() {
        text.push_str(if line.is_empty() { "//" } else { "//     " });
        text.push_str(line);
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&output);
    text
}

/// The expansion once the compiler has run the sibling attribute written back with the
/// `__jobguard_expanded` marker, which returns the function as it is: the attribute is gone.
fn written_back(tokens: TokenStream) -> TokenStream {
    let Ok(mut func) = syn::parse2::<syn::ItemFn>(tokens.clone()) else {
        return tokens;
    };
    func.attrs.retain(|attr| {
        !matches!(&attr.meta, syn::Meta::List(list) if list.tokens.to_string() == "__jobguard_expanded")
    });
    quote::ToTokens::into_token_stream(func)
}

/// The README's expansion section: the `idempotent_retry` case's input and output.
fn readme_section() -> String {
    let case = CASES
        .iter()
        .find(|c| c.name == "idempotent_retry")
        .expect("the README's case");
    let input = pretty(tokens(&format!(
        "#[jobguard::idempotent({})]\n{}",
        case.args,
        case.item
            .trim()
            .replacen("#[retry(", "#[jobguard::retry(", 1)
    )));
    let output = pretty(written_back(expand::attribute(
        case.kind,
        tokens(case.args),
        tokens(case.item),
    )));
    format!(
        "{README_BEGIN}\n<!-- generated by macros/src/snapshot.rs from its `idempotent_retry` case -->\n\n\
         ```rust\n{input}```\n\nexpands to (`cargo expand`):\n\n```rust\n{output}```\n{README_END}"
    )
}

const README_BEGIN: &str = "<!-- expansion:begin -->";
const README_END: &str = "<!-- expansion:end -->";

fn path(case: &Case) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/expand")
        .join(format!("{}.expanded.rs", case.name))
}

/// A line diff of `old` against `new` (longest common subsequence), printed with `-`/`+` and up
/// to two lines of context around each change.
fn diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // lcs[i][j]: the length of the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops = Vec::new(); // (' ' | '-' | '+', line number in the new file or old file, text)
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', j + 1, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i + 1, a[i]));
            i += 1;
        } else {
            ops.push(('+', j + 1, b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 2;
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| op.0 != ' ')
        .map(|(k, _)| k)
        .collect();
    let near = |k: usize| changed.iter().any(|&c| c.abs_diff(k) <= CONTEXT);
    let mut out = String::new();
    let mut skipped = false;
    for (k, (op, line, text)) in ops.iter().enumerate() {
        if near(k) {
            if skipped && !out.is_empty() {
                out.push_str("   ...\n");
            }
            skipped = false;
            out.push_str(&format!("{op} {line:>4} | {text}\n"));
        } else {
            skipped = true;
        }
    }
    out
}

#[test]
fn expansions_match_the_checked_in_files() {
    let bless = std::env::var_os("JOBGUARD_BLESS").is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    for case in CASES {
        let actual = render(case);
        let path = path(case);
        let shown = path
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&path)
            .display()
            .to_string();
        if bless {
            std::fs::create_dir_all(path.parent().expect("a parent directory"))
                .expect("create tests/expand");
            std::fs::write(&path, &actual).unwrap_or_else(|e| panic!("write {shown}: {e}"));
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => failures.push(format!(
                "macros/{shown} differs from the expansion (- checked in, + now; line numbers of the side shown):\n{}",
                diff(&expected, &actual)
            )),
            Err(e) => failures.push(format!("macros/{shown} cannot be read ({e}); the expansion is:\n{actual}")),
        }
    }
    let readme_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("read README.md");
    let section = readme_section();
    match (readme.find(README_BEGIN), readme.find(README_END)) {
        (Some(begin), Some(end)) if begin < end => {
            let current = &readme[begin..end + README_END.len()];
            if current != section {
                if bless {
                    let updated = format!(
                        "{}{section}{}",
                        &readme[..begin],
                        &readme[end + README_END.len()..]
                    );
                    std::fs::write(&readme_path, updated).expect("write README.md");
                } else {
                    failures.push(format!(
                        "README.md's expansion section differs from the expansion (- README, + now):\n{}",
                        diff(current, &section)
                    ));
                }
            }
        }
        _ => failures.push(format!(
            "README.md has no `{README_BEGIN}` ... `{README_END}` section"
        )),
    }
    assert!(
        failures.is_empty(),
        "{}\n\nIf the change is intended, rewrite the files with \
         `JOBGUARD_BLESS=1 cargo test -p jobguard-macros snapshot` and review their diff.",
        failures.join("\n\n")
    );
}

#[test]
fn the_diff_shows_changed_lines_with_context() {
    let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
    let new = "a\nb\nc\nD\ne\nf\ng\nh\n";
    assert_eq!(
        diff(old, new),
        "     2 | b\n     3 | c\n-    4 | d\n+    4 | D\n     5 | e\n     6 | f\n"
    );
    assert_eq!(diff(old, old), "");
}
