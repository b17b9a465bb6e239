//! Checks of the annotated function and of the arguments against it.

use crate::args::{Errors, IdempotentArgs, RetryArgs};
use crate::duration;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, ItemFn, Pat, ReturnType, Type};

/// What the function must be for `#[name]`: `async`, returning `Result`.
pub(crate) fn function(func: &ItemFn, name: &str, errors: &mut Errors) {
    let sig = &func.sig;
    // Why `Result`, in the terms of the attribute that asks.
    let (why, add) = if name == "idempotent" {
        (
            "the `Ok` value is stored for replay, and an `Err` lets a redelivery run the job again",
            "add `-> Result<(), YourError>`: ",
        )
    } else if name == "step" {
        (
            "the `Ok` value is recorded for later runs of the job, and an `Err` lets the next \
             run run the step again",
            "add `-> Result<(), YourError>`: ",
        )
    } else {
        ("an attempt fails by returning `Err`", "")
    };
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token.span,
            format!(
                "`#[{name}]` needs an `async fn`; write `async fn {}`",
                sig.ident
            ),
        );
    }
    match &sig.output {
        ReturnType::Default if name == "idempotent" || name == "step" => errors.at(
            sig.ident.span(),
            format!(
                "`#[{name}]` needs `{}` to return `Result<T, E>`, and it returns `()`; {add}{why}",
                sig.ident
            ),
        ),
        ReturnType::Default => errors.at(
            sig.ident.span(),
            format!(
                "`#[{name}]` needs `{}` to return `Result<T, E>`, and it returns `()`; \
                 add `-> Result<(), YourError>` and return `Err` when an attempt fails",
                sig.ident
            ),
        ),
        ReturnType::Type(_, ty) if !is_result(ty) => errors.at(
            ty.span(),
            format!(
                "`#[{name}]` needs `{}` to return `Result<T, E>`, not `{}`: {why}",
                sig.ident,
                shown(ty)
            ),
        ),
        _ => {}
    }
}

/// A type as the user wrote it, for messages: `Option<u64>`, not `Option < u64 >`.
fn shown(ty: &Type) -> String {
    let text = quote::ToTokens::to_token_stream(ty).to_string();
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let next = chars.peek().copied();
        let prev = out.chars().last();
        let drop_space = c == ' '
            && (matches!(next, Some('<' | '>' | ',' | ':' | ')' | ']'))
                || matches!(prev, Some('<' | '&' | ':' | '(' | '['))
                || next == Some('(') && prev.is_some_and(|p| p.is_alphanumeric()));
        if !drop_space {
            out.push(c);
        }
    }
    out
}

/// `Result<..>` under any path (`std::result::Result`, `io::Result`, `anyhow::Result`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => {
            p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "Result")
        }
        Type::Paren(p) => is_result(&p.elem),
        Type::Group(g) => is_result(&g.elem),
        _ => false,
    }
}

/// The span of `arg` when it is a literal zero duration.
fn zero(arg: &Option<crate::args::DurationArg>) -> Option<proc_macro2::Span> {
    arg.as_ref()
        .filter(|d| d.literal().is_some_and(|d| d.is_zero()))
        .map(|d| d.span())
}

/// `cap < base`, where both are known at compile time (a default counts); `timeout` and
/// `budget`, when literals, are not zero.
pub(crate) fn retry(args: &RetryArgs, errors: &mut Errors) {
    if let Some(span) = zero(&args.timeout) {
        errors.at(
            span,
            "`timeout` is zero, so every attempt would be cut at once and the job could never \
             succeed; `timeout` is the longest one attempt may run, such as `timeout = \"10s\"`, \
             or leave it out for no limit",
        );
    }
    if let Some(span) = zero(&args.budget) {
        errors.at(
            span,
            "`budget` is zero, so the job would be out of time before its first attempt ended; \
             `budget` is the total time for all attempts and their delays, such as \
             `budget = \"1m\"`, or leave it out for no limit",
        );
    }

    const DEFAULT_BASE: std::time::Duration = std::time::Duration::from_millis(500);
    const DEFAULT_CAP: std::time::Duration = std::time::Duration::from_secs(8);
    let base = match &args.base {
        Some(b) => b.literal(),
        None => Some(DEFAULT_BASE),
    };
    let cap = match &args.cap {
        Some(c) => c.literal(),
        None => Some(DEFAULT_CAP),
    };
    if let (Some(base), Some(cap)) = (base, cap)
        && cap < base
    {
        let (base_s, cap_s) = (duration::show(base), duration::show(cap));
        let rule = "`cap` is the longest delay, so it must be at least `base`";
        let (span, message) = match (&args.cap, &args.base) {
            (Some(c), Some(_)) => (
                c.span(),
                format!(
                    "`cap` ({cap_s}) is shorter than `base` ({base_s}); {rule}: \
                     write `cap = \"{base_s}\"` or more, or lower `base`"
                ),
            ),
            (Some(c), None) => (
                c.span(),
                format!(
                    "`cap` ({cap_s}) is shorter than the default `base` of {base_s}; {rule}: \
                     raise `cap`, or add `base = \"{cap_s}\"` or less"
                ),
            ),
            (None, Some(b)) => (
                b.span(),
                format!(
                    "`base` ({base_s}) is longer than the default `cap` of {cap_s}; {rule}: \
                     add `cap = \"{base_s}\"` or more, or lower `base` to \"{cap_s}\" or less"
                ),
            ),
            (None, None) => unreachable!("the defaults are ordered"),
        };
        errors.at(span, message);
    }
}

/// A job has one name: `#[retry(name = ...)]` and `#[idempotent(scope = ...)]` together would
/// give it two.
pub(crate) fn one_name(retry: &RetryArgs, idempotent: &IdempotentArgs, errors: &mut Errors) {
    if let (Some(name), Some(_)) = (&retry.name, &idempotent.scope) {
        errors.at(
            name.span(),
            "the job is named by `#[idempotent(scope = ...)]` already; one name serves metrics, \
             tracing, dead letters and the store, so leave out `name`",
        );
    }
}

/// `key` is required, and the variable it starts from (`order_id`, `order.id`, `self.id`) must
/// be a parameter; `ttl` and `lease`, when literals, are not zero.
pub(crate) fn idempotent(
    func: &ItemFn,
    args: &IdempotentArgs,
    attr_span: proc_macro2::Span,
    errors: &mut Errors,
) {
    let params = parameter_names(func);
    let listed = || {
        if params.is_empty() {
            "the function has no parameters".to_owned()
        } else {
            format!(
                "parameters: {}",
                params
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    match &args.key {
        // The misspelling is reported already, with `key` as the fix.
        None if args.key_misspelled => {}
        None => errors.at(
            attr_span,
            format!(
                "`#[idempotent]` needs a `key`: an expression over the parameters, such as `key = order_id`; {}",
                listed()
            ),
        ),
        Some(key) => {
            if let Some(id) = key_root(key) {
                let name = id.to_string();
                // `CONFIG.prefix`, `Tenant`: a constant, a static or a unit value, not a variable.
                let constant = name.starts_with(|c: char| c.is_ascii_uppercase());
                if !constant && !params.contains(&name) {
                    let near = crate::args::nearest(
                        &name,
                        &params.iter().map(String::as_str).collect::<Vec<_>>(),
                    )
                    .map(|n| format!("; did you mean `{n}`?"))
                    .unwrap_or_default();
                    let what = if matches!(key, Expr::Path(_)) {
                        format!("`key = {name}`: `{name}`")
                    } else {
                        format!("`key` starts from `{name}`, which")
                    };
                    errors.at(
                        id.span(),
                        format!(
                            "{what} is not a parameter of `{}`{near}\n{}",
                            func.sig.ident,
                            listed()
                        ),
                    );
                }
            }
        }
    }

    if let Some(span) = zero(&args.ttl) {
        errors.at(
            span,
            "`ttl` is zero, so no result would be kept and every redelivery would run the job again; \
             `ttl` is how long a completed result is replayed, such as `ttl = \"24h\"` (the default)",
        );
    }
    if let Some(crate::args::InProgress::Wait(wait)) = &args.in_progress
        && wait.literal().is_some_and(|d| d.is_zero())
    {
        errors.at(
            wait.span(),
            "`wait(\"0s\")` gives up at once, which is what `in_progress = fail` says; write \
             `in_progress = fail`, or wait long enough for the other run to finish, such as \
             `wait(\"10s\")`",
        );
    }
    if let Some(span) = zero(&args.lease) {
        errors.at(
            span,
            "`lease` is zero, so a claim would lapse at once and a second worker could run the job \
             beside the first; `lease` is how long a crashed worker can hold the key, such as \
             `lease = \"30s\"` (the default)",
        );
    }
    if let Some(tx) = &args.transaction {
        transaction(func, args, tx, errors);
    }
    if let Some(error) = sqlx_error(func) {
        // The whole path, not only its first segment.
        errors.push(syn::Error::new_spanned(error, SQLX_ERROR));
    }
}

/// `sqlx::Error` cannot be the error of an `#[idempotent]` function: rustc would report its
/// blanket `From<T: DatabaseError>` ("`jobguard::Error: DatabaseError` is not satisfied")
/// instead of the missing `From<jobguard::Error>`.
const SQLX_ERROR: &str = "`sqlx::Error` cannot carry jobguard's own errors (a key reused, the \
    database unreachable), which `#[idempotent]` returns in the job's error type; return your own \
    error type with `From<sqlx::Error>` and `From<jobguard::Error>`, such as\n\
    \n\
    #[derive(Debug)]\n\
    enum JobError { Db(sqlx::Error), Guard(jobguard::Error) }\n\
    impl From<sqlx::Error> for JobError { fn from(e: sqlx::Error) -> Self { JobError::Db(e) } }\n\
    impl From<jobguard::Error> for JobError { fn from(e: jobguard::Error) -> Self { JobError::Guard(e) } }";

/// The error type of `func`'s `Result<T, E>` when it is written as a path ending in
/// `sqlx::Error` (`sqlx::Error`, `::sqlx::Error`, `sqlx::error::Error`), or the whole return
/// type when it is `sqlx::Result<T>`. An `Error` or `Result` imported from sqlx under its bare
/// name cannot be told from another.
fn sqlx_error(func: &ItemFn) -> Option<&Type> {
    let syn::ReturnType::Type(_, ret) = &func.sig.output else {
        return None;
    };
    let Type::Path(p) = &**ret else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let from_sqlx = p.qself.is_none()
        && p.path.segments.len() >= 2
        && p.path.segments.first().is_some_and(|s| s.ident == "sqlx");
    if from_sqlx && args.args.len() == 1 {
        return Some(ret);
    }
    let error = args.args.iter().nth(1).and_then(|a| match a {
        syn::GenericArgument::Type(t) => Some(t),
        _ => None,
    })?;
    let Type::Path(e) = error else { return None };
    let segments: Vec<String> = e
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    let is_sqlx = e.qself.is_none()
        && segments.len() >= 2
        && segments.first().is_some_and(|s| s == "sqlx")
        && segments.last().is_some_and(|s| s == "Error");
    is_sqlx.then_some(error)
}

/// `transaction = tx`: `tx` is a parameter of type `&mut PgConnection` or
/// `&mut Transaction<'_, Postgres>`, and the arguments that only the store form reads are absent.
fn transaction(func: &ItemFn, args: &IdempotentArgs, tx: &Expr, errors: &mut Errors) {
    const TYPES: &str = "`&mut sqlx::PgConnection` or `&mut sqlx::Transaction<'_, Postgres>`";
    // The key row lives in the transaction's database, so there is no store to pick, no lease to
    // renew and no claim held elsewhere to wait for: a duplicate waits on the key's row lock.
    for (given, arg, why) in [
        (
            args.store.as_ref().map(Spanned::span),
            "store",
            "the key is kept in the transaction's own database (table `jobguard_keys`)",
        ),
        (
            args.lease.as_ref().map(|d| d.span()),
            "lease",
            "the key's row is locked by the transaction until it ends, so there is no lease",
        ),
        (
            args.crashes.as_ref().map(Spanned::span),
            "crashes",
            "a worker that dies rolls its transaction back, key and all, so there is no claim \
             left behind to count",
        ),
        (
            args.in_progress.as_ref().map(|_| tx.span()),
            "in_progress",
            "a duplicate in another transaction waits on the key's row until this one ends",
        ),
    ] {
        if let Some(span) = given {
            errors.at(
                span,
                format!("`{arg}` cannot be given with `transaction`: {why}; remove `{arg}`"),
            );
        }
    }
    let Expr::Path(path) = tx else {
        errors.at(
            tx.span(),
            format!("`transaction` names a parameter of type {TYPES}, such as `transaction = tx`"),
        );
        return;
    };
    let Some(name) = path.path.get_ident() else {
        errors.at(
            tx.span(),
            format!("`transaction` names a parameter of type {TYPES}, such as `transaction = tx`"),
        );
        return;
    };
    let typed = func.sig.inputs.iter().find_map(|input| match input {
        FnArg::Typed(t) => match &*t.pat {
            Pat::Ident(i) if i.ident == *name => Some((&i.ident, &*t.ty)),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    let Some((param, ty)) = typed else {
        let params = parameter_names(func);
        let near = crate::args::nearest(
            &name.to_string(),
            &params.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .map(|n| format!("; did you mean `{n}`?"))
        .unwrap_or_default();
        errors.at(
            name.span(),
            format!(
                "`transaction = {name}`: `{name}` is not a parameter of `{}`{near}\n\
                 add a parameter `{name}: &mut PgConnection` (or `&mut Transaction<'_, Postgres>`) \
                 holding the caller's transaction",
                func.sig.ident
            ),
        );
        return;
    };
    if !is_transaction_type(ty) {
        // On the parameter's name: a type's span is only its first token on stable Rust.
        errors.at(
            param.span(),
            format!(
                "`transaction = {name}` needs `{name}` to be {TYPES}, and it is `{}`: the key is \
                 written in that transaction, which the caller commits",
                shown(ty)
            ),
        );
    }
}

/// `&mut PgConnection` or `&mut Transaction<'_, Postgres>`, under any path.
fn is_transaction_type(ty: &Type) -> bool {
    let Type::Reference(r) = ty else {
        return false;
    };
    if r.mutability.is_none() {
        return false;
    }
    let Type::Path(p) = &*r.elem else {
        return false;
    };
    let Some(last) = p.path.segments.last() else {
        return false;
    };
    if last.ident == "PgConnection" {
        return matches!(last.arguments, syn::PathArguments::None);
    }
    if last.ident != "Transaction" {
        return false;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return false;
    };
    args.args.iter().any(|a| {
        matches!(a, syn::GenericArgument::Type(Type::Path(t))
            if t.path.segments.last().is_some_and(|s| s.ident == "Postgres"))
    })
}

/// The variable a key expression reads from: `order_id`, `order` in `order.id` or
/// `&order.ids[0]`, `self` in `self.id()`. `None` for anything else (`format!(...)`, a call),
/// which the compiler checks on the user's tokens.
fn key_root(expr: &Expr) -> Option<&syn::Ident> {
    match expr {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        Expr::Field(f) => key_root(&f.base),
        Expr::MethodCall(m) => key_root(&m.receiver),
        Expr::Index(i) => key_root(&i.expr),
        Expr::Reference(r) => key_root(&r.expr),
        Expr::Unary(u) => key_root(&u.expr),
        Expr::Paren(p) => key_root(&p.expr),
        Expr::Group(g) => key_root(&g.expr),
        _ => None,
    }
}

fn parameter_names(func: &ItemFn) -> Vec<String> {
    let mut names = Vec::new();
    for input in &func.sig.inputs {
        match input {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(t) => collect_pat(&t.pat, &mut names),
        }
    }
    names
}

fn collect_pat(pat: &Pat, names: &mut Vec<String>) {
    match pat {
        Pat::Ident(i) => names.push(i.ident.to_string()),
        Pat::Tuple(t) => t.elems.iter().for_each(|p| collect_pat(p, names)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| collect_pat(p, names)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| collect_pat(&f.pat, names)),
        Pat::Reference(r) => collect_pat(&r.pat, names),
        Pat::Type(t) => collect_pat(&t.pat, names),
        Pat::Slice(s) => s.elems.iter().for_each(|p| collect_pat(p, names)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::{is_transaction_type, key_root, shown, sqlx_error};

    #[test]
    fn sqlx_error_paths_are_recognised() {
        let found = |ret: &str| {
            let func: syn::ItemFn = syn::parse_str(&format!("async fn f() -> {ret} {{}}")).unwrap();
            sqlx_error(&func).is_some()
        };
        for ret in [
            "Result<u8, sqlx::Error>",
            "Result<u8, ::sqlx::Error>",
            "std::result::Result<(), sqlx::error::Error>",
            "sqlx::Result<u8>",
            "::sqlx::Result<()>",
        ] {
            assert!(found(ret), "{ret}");
        }
        for ret in [
            "Result<u8, Error>",
            "Result<u8, MyError>",
            "Result<u8, my::sqlx::Error>",
            "Result<u8, sqlx::ErrorKind>",
            "Result<sqlx::Error, E>",
            "Option<sqlx::Error>",
        ] {
            assert!(!found(ret), "{ret}");
        }
    }

    #[test]
    fn transaction_types() {
        let ok = |s: &str| is_transaction_type(&syn::parse_str(s).unwrap());
        assert!(ok("&mut PgConnection"));
        assert!(ok("&mut sqlx::PgConnection"));
        assert!(ok("&'a mut sqlx::postgres::PgConnection"));
        assert!(ok("&mut Transaction<'_, Postgres>"));
        assert!(ok("&mut sqlx::Transaction<'static, sqlx::Postgres>"));
        assert!(!ok("&PgConnection"));
        assert!(!ok("PgConnection"));
        assert!(!ok("&mut PgPool"));
        assert!(!ok("&mut Transaction<'_, MySql>"));
        assert!(!ok("&mut String"));
    }

    #[test]
    fn keys_are_read_from_their_first_variable() {
        let root = |s: &str| key_root(&syn::parse_str(s).unwrap()).map(|i| i.to_string());
        assert_eq!(root("order_id").as_deref(), Some("order_id"));
        assert_eq!(root("order.id").as_deref(), Some("order"));
        assert_eq!(root("&self.orders[0].id()").as_deref(), Some("self"));
        assert_eq!(root("(*order).id").as_deref(), Some("order"));
        assert_eq!(root(r#"format!("{tenant}:{id}")"#), None);
        assert_eq!(root("make_key(order_id)"), None);
        assert_eq!(root("crate::KEY"), None);
    }

    #[test]
    fn types_are_shown_as_written() {
        let ty = |s: &str| shown(&syn::parse_str(s).unwrap());
        assert_eq!(ty("Option<u64>"), "Option<u64>");
        assert_eq!(ty("&'a str"), "&'a str");
        assert_eq!(ty("Vec<(u8, u16)>"), "Vec<(u8, u16)>");
        assert_eq!(
            ty("std::option::Option<Box<dyn Fn()>>"),
            "std::option::Option<Box<dyn Fn()>>"
        );
    }
}
