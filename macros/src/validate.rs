//! Checks of the annotated function and of the arguments against it.

use crate::args::{Errors, IdempotentArgs, RetryArgs};
use crate::duration;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, ItemFn, Pat, ReturnType, Type};

/// What the function must be for `#[name]`: `async`, returning `Result`.
pub(crate) fn function(func: &ItemFn, name: &str, errors: &mut Errors) {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.at(
            sig.fn_token.span,
            format!("`#[{name}]` needs an `async fn`; write `async fn {}`", sig.ident),
        );
    }
    match &sig.output {
        ReturnType::Default => errors.at(
            sig.ident.span(),
            format!("`#[{name}]` needs a function returning `Result<T, E>`; `{}` returns `()`", sig.ident),
        ),
        ReturnType::Type(_, ty) if !is_result(ty) => errors.at(
            ty.span(),
            format!("`#[{name}]` needs a function returning `Result<T, E>`: a failure must be an `Err` it can retry or replay"),
        ),
        _ => {}
    }
}

/// `Result<..>` under any path (`std::result::Result`, `io::Result`, `anyhow::Result`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "Result"),
        Type::Paren(p) => is_result(&p.elem),
        Type::Group(g) => is_result(&g.elem),
        _ => false,
    }
}

/// `cap < base`, where both are known at compile time (a default counts).
pub(crate) fn retry(args: &RetryArgs, errors: &mut Errors) {
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
    if let (Some(base), Some(cap)) = (base, cap) {
        if cap < base {
            let (span, which) = match (&args.cap, &args.base) {
                (Some(c), _) => (c.span(), "`cap`"),
                (None, Some(b)) => (b.span(), "`base`"),
                (None, None) => unreachable!("the defaults are ordered"),
            };
            let shown = |d, given: bool| if given { duration::show(d) } else { format!("{} (the default)", duration::show(d)) };
            errors.at(
                span,
                format!(
                    "{which}: `cap` ({}) is shorter than `base` ({}); the delay before retry n is min(cap, base * 2^(n-1)), so `cap` must be at least `base`",
                    shown(cap, args.cap.is_some()),
                    shown(base, args.base.is_some()),
                ),
            );
        }
    }
}

/// `key` is required; a bare identifier must name a parameter.
pub(crate) fn idempotent(func: &ItemFn, args: &IdempotentArgs, attr_span: proc_macro2::Span, errors: &mut Errors) {
    let params = parameter_names(func);
    let listed = || {
        if params.is_empty() {
            "the function has no parameters".to_owned()
        } else {
            format!("parameters: {}", params.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", "))
        }
    };
    match &args.key {
        None => errors.at(
            attr_span,
            format!("`#[idempotent]` needs a `key`: an expression over the parameters, such as `key = order_id`; {}", listed()),
        ),
        Some(Expr::Path(p)) if p.qself.is_none() => {
            if let Some(id) = p.path.get_ident() {
                let name = id.to_string();
                let is_const = name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                if !is_const && !params.iter().any(|p| *p == name) {
                    let near = crate::args::nearest(&name, &params.iter().map(String::as_str).collect::<Vec<_>>())
                        .map(|n| format!("; did you mean `{n}`?"))
                        .unwrap_or_default();
                    errors.at(id.span(), format!("`key = {name}`: `{name}` is not a parameter of `{}`{near}\n{}", func.sig.ident, listed()));
                }
            }
        }
        Some(_) => {}
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
