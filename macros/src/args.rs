//! Parsing attribute arguments: each key stored once with its span, every error collected.

use crate::duration;
use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Path};

/// Every error found, reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn at(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn into_compile_error(self) -> TokenStream {
        self.0.map(|e| e.to_compile_error()).unwrap_or_default()
    }
}

/// A duration argument: a string literal parsed here, or any expression of type `Duration`.
pub(crate) enum DurationArg {
    Literal(std::time::Duration, Span),
    Expr(Expr),
}

impl DurationArg {
    /// `key = "2s"` or `key = <Duration expression>`; `key` names the argument in messages.
    fn parse(key: &str, expr: Expr, errors: &mut Errors) -> Option<Self> {
        match expr {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => match duration::parse(&s.value()) {
                Ok(d) => Some(DurationArg::Literal(d, s.span())),
                Err(bad) => {
                    errors.at(s.span(), bad.message(key, &s.value()));
                    None
                }
            },
            Expr::Lit(ExprLit {
                lit: Lit::Int(i), ..
            }) => {
                let n = i.base10_digits();
                let as_str = |unit: &str| duration::written(key, &format!("\"{n}{unit}\""));
                errors.at(
                    i.span(),
                    format!(
                        "`{}` has no unit; write a string such as `{}` or `{}`, or a `Duration` expression such as `{}`",
                        duration::written(key, n),
                        as_str("ms"),
                        as_str("s"),
                        duration::written(key, &format!("Duration::from_millis({n})")),
                    ),
                );
                None
            }
            Expr::Lit(ExprLit {
                lit: Lit::Float(f), ..
            }) => {
                let n = f.base10_digits();
                errors.at(
                    f.span(),
                    format!(
                        "`{}` has no unit; write a string such as `{}`, or a `Duration` expression",
                        duration::written(key, n),
                        duration::written(key, &format!("\"{n}s\"")),
                    ),
                );
                None
            }
            other => Some(DurationArg::Expr(other)),
        }
    }

    pub(crate) fn literal(&self) -> Option<std::time::Duration> {
        match self {
            DurationArg::Literal(d, _) => Some(*d),
            DurationArg::Expr(_) => None,
        }
    }

    pub(crate) fn span(&self) -> Span {
        match self {
            DurationArg::Literal(_, span) => *span,
            DurationArg::Expr(e) => e.span(),
        }
    }
}

/// `on = ...`: what decides whether a failure is retried.
pub(crate) enum On {
    Transient(Span),
    All(Span),
    Classifier(Expr),
}

/// `#[retry(...)]`.
#[derive(Default)]
pub(crate) struct RetryArgs {
    pub attempts: Option<Expr>,
    pub base: Option<DurationArg>,
    pub cap: Option<DurationArg>,
    pub jitter: Option<Ident>,
    pub on: Option<On>,
    pub on_ok: Option<Expr>,
    pub name: Option<LitStr>,
    pub budget: Option<DurationArg>,
    pub timeout: Option<DurationArg>,
    pub breaker: Option<Expr>,
    pub retry_budget: Option<Expr>,
    pub dead_letter: Option<Expr>,
    pub payload: Option<Expr>,
    pub krate: Option<Path>,
}

pub(crate) const JITTERS: &[&str] = &["none", "full", "equal", "decorrelated"];

/// `in_progress = ...`: what a call does when another worker holds the key.
pub(crate) enum InProgress {
    Fail,
    Wait(DurationArg),
}

/// `#[idempotent(...)]`.
#[derive(Default)]
pub(crate) struct IdempotentArgs {
    pub key: Option<Expr>,
    pub ttl: Option<DurationArg>,
    pub lease: Option<DurationArg>,
    pub crashes: Option<syn::LitInt>,
    pub scope: Option<LitStr>,
    pub fingerprint: Option<Expr>,
    pub store: Option<Expr>,
    pub in_progress: Option<InProgress>,
    pub transaction: Option<Expr>,
    pub krate: Option<Path>,
    /// An unknown argument was reported with "did you mean `key`?" (`keys = order_id`), so a
    /// missing `key` is not reported a second time.
    pub key_misspelled: bool,
}

/// `#[step(...)]`.
#[derive(Default)]
pub(crate) struct StepArgs {
    pub name: Option<LitStr>,
    pub krate: Option<Path>,
}

/// Stores `value` in `slot`, or reports the key given twice.
fn once<T>(slot: &mut Option<T>, key: &str, span: Span, value: Option<T>, errors: &mut Errors) {
    if slot.is_some() {
        errors.at(span, format!("`{key}` given twice; keep one"));
    } else if value.is_some() {
        *slot = value;
    }
}

/// Reads `key = <expr>`, or reports a key given without a value.
fn value(meta: &ParseNestedMeta<'_>, key: &str, errors: &mut Errors) -> syn::Result<Option<Expr>> {
    if meta.input.peek(syn::Token![=]) {
        Ok(Some(meta.value()?.parse()?))
    } else {
        errors.at(
            meta.path.span(),
            format!("`{key}` needs a value: `{key} = ...`"),
        );
        if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
            // `key(...)` or similar: skip what follows so the next key still parses.
            let _: TokenStream = meta.input.parse()?;
        }
        Ok(None)
    }
}

fn key_name(meta: &ParseNestedMeta<'_>) -> String {
    if meta.path.is_ident("crate") {
        return "crate".into();
    }
    meta.path
        .get_ident()
        .map(|i| i.to_string())
        .unwrap_or_else(|| {
            quote::ToTokens::to_token_stream(&meta.path)
                .to_string()
                .replace(' ', "")
        })
}

/// Reports an unknown argument; returns the valid name suggested for it, if any.
fn unknown(
    key: &str,
    span: Span,
    valid: &[&'static str],
    what: &str,
    errors: &mut Errors,
) -> Option<&'static str> {
    let list = valid
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let near = nearest(key, valid);
    let hint = match near {
        Some(near) => format!("; did you mean `{near}`?"),
        None => String::new(),
    };
    errors.at(
        span,
        format!("unknown argument `{key}` for `#[{what}]`{hint}\nvalid arguments: {list}"),
    );
    near
}

/// The valid name closest to `typo`, when it is close enough to be a typo.
pub(crate) fn nearest<'a>(typo: &str, valid: &[&'a str]) -> Option<&'a str> {
    valid
        .iter()
        .map(|v| (levenshtein(typo, v), *v))
        .filter(|(d, v)| *d <= (v.len().max(typo.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn crate_path(expr: Expr, errors: &mut Errors) -> Option<Path> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => {
            match s.parse::<Path>() {
                Ok(p) => Some(p),
                Err(_) => {
                    errors.at(s.span(), "`crate` takes a path in a string, such as `crate = \"my_facade::jobguard\"`");
                    None
                }
            }
        }
        other => {
            errors.at(
                other.span(),
                "`crate` takes a path in a string, such as `crate = \"my_facade::jobguard\"`",
            );
            None
        }
    }
}

/// One argument of an attribute: its name, and how its value is checked and stored.
pub(crate) struct Key<A> {
    pub name: &'static str,
    set: fn(&mut A, Span, Expr, &mut Errors),
}

/// A table entry for `$name = ...`: `$parse(key, expr, errors)` checks the value, and the result
/// goes into `args.$field` once.
macro_rules! key {
    ($name:literal => $field:ident, $parse:expr) => {
        Key {
            name: $name,
            set: |args, span, expr, errors| {
                let value = $parse($name, expr, errors);
                once(&mut args.$field, $name, span, value, errors)
            },
        }
    };
}

/// Any expression, taken as it is.
fn expr(_: &str, expr: Expr, _: &mut Errors) -> Option<Expr> {
    Some(expr)
}

/// `#[retry(...)]`'s arguments, in the order the docs list them.
pub(crate) const RETRY: &[Key<RetryArgs>] = &[
    key!("attempts" => attempts, |_, e, errors| attempts(e, errors)),
    key!("base" => base, DurationArg::parse),
    key!("cap" => cap, DurationArg::parse),
    key!("jitter" => jitter, |_, e, errors| jitter(e, errors)),
    key!("on" => on, |_, e, errors| on(e, errors)),
    key!("on_ok" => on_ok, |_, e, errors| on_ok(e, errors)),
    key!("budget" => budget, DurationArg::parse),
    key!("timeout" => timeout, DurationArg::parse),
    key!("breaker" => breaker, expr),
    key!("retry_budget" => retry_budget, expr),
    key!("dead_letter" => dead_letter, expr),
    key!("payload" => payload, expr),
    key!("name" => name, |_, e, errors| name(e, errors)),
    key!("crate" => krate, |_, e, errors| crate_path(e, errors)),
];

/// `#[idempotent(...)]`'s arguments, in the order the docs list them.
pub(crate) const IDEMPOTENT: &[Key<IdempotentArgs>] = &[
    key!("key" => key, expr),
    key!("ttl" => ttl, DurationArg::parse),
    key!("lease" => lease, DurationArg::parse),
    key!("crashes" => crashes, |_, e, errors| crashes(e, errors)),
    key!("scope" => scope, |_, e, errors| scope(e, errors)),
    key!("fingerprint" => fingerprint, expr),
    key!("store" => store, expr),
    key!("in_progress" => in_progress, |_, e, errors| in_progress(e, errors)),
    key!("transaction" => transaction, expr),
    key!("crate" => krate, |_, e, errors| crate_path(e, errors)),
];

/// `#[step(...)]`'s arguments.
pub(crate) const STEP: &[Key<StepArgs>] = &[
    key!("name" => name, |_, e, errors| step_name(e, errors)),
    key!("crate" => krate, |_, e, errors| crate_path(e, errors)),
];

/// The names of `keys`, for messages.
pub(crate) fn names<A>(keys: &[Key<A>]) -> Vec<&'static str> {
    keys.iter().map(|k| k.name).collect()
}

/// Parses `#[retry(...)]`'s arguments.
pub(crate) fn retry(tokens: TokenStream, errors: &mut Errors) -> RetryArgs {
    parse(tokens, "retry", RETRY, errors).0
}

/// Parses `#[step(...)]`'s arguments.
pub(crate) fn step(tokens: TokenStream, errors: &mut Errors) -> StepArgs {
    parse(tokens, "step", STEP, errors).0
}

/// Parses `#[idempotent(...)]`'s arguments.
pub(crate) fn idempotent(tokens: TokenStream, errors: &mut Errors) -> IdempotentArgs {
    let (mut args, suggested) = parse(tokens, "idempotent", IDEMPOTENT, errors);
    args.key_misspelled = suggested.contains(&"key");
    args
}

/// The one parser: `key = value` pairs from `keys`, each at most once; an unknown key is named
/// with every valid one and the nearest. Returns the arguments and the names suggested for
/// unknown keys.
fn parse<A: Default>(
    tokens: TokenStream,
    what: &str,
    keys: &[Key<A>],
    errors: &mut Errors,
) -> (A, Vec<&'static str>) {
    let mut args = A::default();
    let mut suggested = Vec::new();
    let parser = syn::meta::parser(|meta| {
        let key = key_name(&meta);
        let span = meta.path.span();
        let Some(entry) = keys.iter().find(|k| k.name == key) else {
            suggested.extend(unknown(&key, span, &names(keys), what, errors));
            if meta.input.peek(syn::Token![=]) {
                let _: Expr = meta.value()?.parse()?;
            }
            return Ok(());
        };
        if let Some(value) = value(&meta, &key, errors)? {
            (entry.set)(&mut args, span, value, errors);
        }
        Ok(())
    });
    if let Err(e) = parser.parse2(tokens) {
        errors.push(e);
    }
    (args, suggested)
}

fn attempts(expr: Expr, errors: &mut Errors) -> Option<Expr> {
    const HELP: &str =
        "`attempts` is the total number of attempts, the first included, such as `attempts = 5`";
    match &expr {
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            errors.at(
                expr.span(),
                format!("`attempts` cannot be negative; {HELP}"),
            );
            return None;
        }
        Expr::Lit(ExprLit {
            lit: Lit::Int(_), ..
        }) => {}
        Expr::Lit(lit) => {
            errors.at(
                lit.span(),
                format!("`attempts` takes a whole number, without quotes; {HELP}"),
            );
            return None;
        }
        _ => {}
    }
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(i), ..
    }) = &expr
    {
        match i.base10_parse::<u32>() {
            Ok(0) => {
                errors.at(i.span(), "`attempts` counts the first attempt too, so it must be at least 1 (`attempts = 1` means no retry)");
                return None;
            }
            Ok(_) => {}
            Err(_) => {
                errors.at(
                    i.span(),
                    "`attempts` must be a whole number from 1 to 4294967295",
                );
                return None;
            }
        }
    }
    Some(expr)
}

/// `crashes = N`: a whole number literal, `0` for "never poison".
fn crashes(expr: Expr, errors: &mut Errors) -> Option<syn::LitInt> {
    const HELP: &str = "`crashes` is how many times a worker may die running the job before it is \
                        refused and dead-lettered, such as `crashes = 3` (the default); \
                        `crashes = 0` never refuses it";
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => match i.base10_parse::<u32>() {
            Ok(_) if i.suffix().is_empty() || i.suffix() == "u32" => Some(i),
            Ok(_) => {
                errors.at(
                    i.span(),
                    format!("`crashes` takes a whole number without a suffix; {HELP}"),
                );
                None
            }
            Err(_) => {
                errors.at(
                    i.span(),
                    format!("`crashes` must be a whole number from 0 to 4294967295; {HELP}"),
                );
                None
            }
        },
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            errors.at(expr.span(), format!("`crashes` cannot be negative; {HELP}"));
            None
        }
        Expr::Lit(lit) => {
            errors.at(
                lit.span(),
                format!("`crashes` takes a whole number, without quotes; {HELP}"),
            );
            None
        }
        other => {
            errors.at(
                other.span(),
                format!("`crashes` takes a whole number literal; {HELP}"),
            );
            None
        }
    }
}

fn jitter(expr: Expr, errors: &mut Errors) -> Option<Ident> {
    let list = "`none`, `full`, `equal` or `decorrelated`";
    if let Expr::Path(p) = &expr
        && let Some(id) = p.path.get_ident()
    {
        let name = id.to_string();
        if JITTERS.contains(&name.as_str()) {
            return Some(id.clone());
        }
        let hint = nearest(&name, JITTERS)
            .map(|n| format!("; did you mean `{n}`?"))
            .unwrap_or_default();
        errors.at(
            id.span(),
            format!("unknown jitter `{name}`{hint}\njitter is one of {list}"),
        );
        return None;
    }
    errors.at(expr.span(), format!("jitter is one of {list}"));
    None
}

fn on(expr: Expr, errors: &mut Errors) -> Option<On> {
    const HELP: &str = "`on` is `transient` (the error's `jobguard::Transient` verdict), `all`, \
                        or the path of a function `fn(&E) -> Verdict` (or `-> bool`), such as `on = my_classifier`";
    match &expr {
        Expr::Path(p) if p.path.is_ident("transient") => Some(On::Transient(p.span())),
        Expr::Path(p) if p.path.is_ident("all") => Some(On::All(p.span())),
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => {
            let value = s.value();
            let hint = match value.as_str() {
                "transient" | "all" => format!("write `on = {value}`, without quotes"),
                _ => format!("name the function without quotes: `on = {value}`"),
            };
            errors.at(
                s.span(),
                format!("`on` takes a name, not a string: {hint}\n{HELP}"),
            );
            None
        }
        Expr::Lit(lit) => {
            errors.at(lit.span(), HELP);
            None
        }
        _ => Some(On::Classifier(expr)),
    }
}

fn on_ok(expr: Expr, errors: &mut Errors) -> Option<Expr> {
    match &expr {
        Expr::Lit(lit) => {
            errors.at(
                lit.span(),
                "`on_ok` takes the path of a function `fn(&T) -> Verdict` (or `-> bool`) over the `Ok` value, such as `on_ok = unavailable`",
            );
            None
        }
        _ => Some(expr),
    }
}

/// `name = "..."`: the job's one name; checked like a `scope`, which it becomes.
fn name(expr: Expr, errors: &mut Errors) -> Option<LitStr> {
    match &expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(_), ..
        }) => scope(expr, errors),
        other => {
            errors.at(
                other.span(),
                "`name` takes a string literal, such as `name = \"payments.charge\"`",
            );
            None
        }
    }
}

/// The longest step name the stores keep, in bytes (`jobguard::store::MAX_STEP_NAME`).
const MAX_STEP_NAME: usize = 200;

/// `#[step(name = "...")]`: the step's stored name, a string literal of 1 to
/// [`MAX_STEP_NAME`] bytes.
fn step_name(expr: Expr, errors: &mut Errors) -> Option<LitStr> {
    const HELP: &str = "a step's name is how its recorded value is found again, so it is \
        fixed when the code is written: such as `name = \"capture.v1\"`";
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => {
            let len = s.value().len();
            if len == 0 || len > MAX_STEP_NAME {
                errors.at(
                    s.span(),
                    format!(
                        "`name` is {len} bytes; a step's name is 1 to {MAX_STEP_NAME} bytes, \
                         such as `name = \"capture.v1\"`"
                    ),
                );
                return None;
            }
            Some(s)
        }
        other => {
            errors.at(
                other.span(),
                format!("`name` takes a string literal, not an expression: {HELP}"),
            );
            None
        }
    }
}

fn scope(expr: Expr, errors: &mut Errors) -> Option<LitStr> {
    const EXAMPLE: &str = "such as `scope = \"payments.charge\"`";
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => {
            let v = s.value();
            let problem = if v.is_empty() {
                Some("is empty".to_owned())
            } else if v.contains(':') {
                Some("contains `:`, which the store puts between the scope and the key".to_owned())
            } else if v.chars().any(char::is_whitespace) {
                Some("contains a space".to_owned())
            } else if v.chars().any(char::is_control) {
                Some("contains a control character".to_owned())
            } else {
                None
            };
            let Some(problem) = problem else {
                return Some(s);
            };
            // The same words, joined by `.` (`payments::charge` → `payments.charge`).
            let fixed = v
                .split(|c: char| c == ':' || c.is_whitespace() || c.is_control())
                .filter(|part| !part.is_empty())
                .collect::<Vec<_>>()
                .join(".");
            let fix = if fixed.is_empty() {
                format!("name the job, {EXAMPLE}, or leave `scope` out to use the function's path")
            } else {
                format!("write `scope = \"{fixed}\"`")
            };
            errors.at(
                s.span(),
                format!(
                    "`scope = {}` {problem}; {fix}",
                    quote::ToTokens::to_token_stream(&s)
                ),
            );
            None
        }
        other => {
            errors.at(
                other.span(),
                format!("`scope` takes a string literal, {EXAMPLE}"),
            );
            None
        }
    }
}

fn in_progress(expr: Expr, errors: &mut Errors) -> Option<InProgress> {
    const HELP: &str = "`in_progress` says what a call does while another worker holds the key: \
                        `fail` (return `jobguard::Error::InProgress` at once; the default) or \
                        `wait(\"10s\")` (wait up to that long for the other run's result)";
    match expr {
        Expr::Path(p) if p.path.is_ident("fail") => Some(InProgress::Fail),
        Expr::Path(p) if p.path.is_ident("wait") => {
            errors.at(
                p.span(),
                format!("`wait` needs a limit: `in_progress = wait(\"10s\")`\n{HELP}"),
            );
            None
        }
        Expr::Call(call) if matches!(&*call.func, Expr::Path(p) if p.path.is_ident("wait")) => {
            if call.args.len() != 1 {
                errors.at(
                    call.span(),
                    format!("`wait` takes one duration, such as `wait(\"10s\")`\n{HELP}"),
                );
                return None;
            }
            let arg = call.args.into_iter().next().expect("one argument");
            DurationArg::parse("wait", arg, errors).map(InProgress::Wait)
        }
        Expr::Path(p) if p.path.get_ident().is_some() => {
            let id = p.path.get_ident().expect("checked");
            let hint = nearest(&id.to_string(), &["fail", "wait"])
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_default();
            errors.at(
                id.span(),
                format!("unknown `in_progress = {id}`{hint}\n{HELP}"),
            );
            None
        }
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => {
            let v = s.value();
            let fix = if v == "fail" {
                "write `in_progress = fail`, without quotes".to_owned()
            } else if v == "wait" {
                "write `in_progress = wait(\"10s\")`, without quotes around `wait`".to_owned()
            } else if duration::parse(&v).is_ok() {
                format!("to wait, write `in_progress = wait(\"{v}\")`")
            } else {
                "write `fail` or `wait(\"10s\")`, without quotes around the name".to_owned()
            };
            errors.at(
                s.span(),
                format!("`in_progress` takes a name, not a string: {fix}\n{HELP}"),
            );
            None
        }
        other => {
            errors.at(other.span(), HELP);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_names() {
        let keys = names(RETRY);
        assert_eq!(nearest("attemps", &keys), Some("attempts"));
        assert_eq!(nearest("jiter", &keys), Some("jitter"));
        assert_eq!(nearest("deadletter", &keys), Some("dead_letter"));
        assert_eq!(nearest("zzzzzz", &keys), None);
        assert_eq!(nearest("ful", JITTERS), Some("full"));
    }
}
