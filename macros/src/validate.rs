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
            format!(
                "`#[{name}]` needs an `async fn`; write `async fn {}`",
                sig.ident
            ),
        );
    }
    match &sig.output {
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
                "`#[{name}]` needs `{}` to return `Result<T, E>`, not `{}`: an attempt fails by returning `Err`",
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

/// `key` is required; a bare identifier must name a parameter.
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
        None => errors.at(
            attr_span,
            format!("`#[idempotent]` needs a `key`: an expression over the parameters, such as `key = order_id`; {}", listed()),
        ),
        Some(Expr::Path(p)) if p.qself.is_none() => {
            if let Some(id) = p.path.get_ident() {
                let name = id.to_string();
                let is_const = name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                if !is_const && !params.contains(&name) {
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

#[cfg(test)]
mod tests {
    use super::shown;

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
