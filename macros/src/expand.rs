//! The expansion. Both attributes go through [`attribute`]: whichever is written first finds the
//! other among the function's attributes, takes it, and the pair expands once, idempotency
//! outside, retry inside. No wrapper nests in another.

use crate::args::{self, DurationArg, Errors, IdempotentArgs, InProgress, On, RetryArgs, StepArgs};
use crate::validate;
use proc_macro2::{Literal, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Block, Ident, ItemFn, Meta, Path, ReturnType, Type};

/// Which attribute is expanding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Retry,
    Idempotent,
    Step,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Retry => "retry",
            Kind::Idempotent => "idempotent",
            Kind::Step => "step",
        }
    }
}

/// Parses, validates and expands one attribute (and its sibling, when the function has both).
/// On any error the function is emitted unchanged beside every error found, so one mistake does
/// not cascade.
pub(crate) fn attribute(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    if kind == Kind::Step {
        return step(args, item);
    }
    if is_expanded_marker(&args) {
        // Re-emitted by its sibling, which expanded both: nothing left to do.
        return item;
    }
    let mut errors = Errors::default();
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            errors.at(
                Span::call_site(),
                format!(
                    "`#[{}]` goes on an `async fn` returning `Result`",
                    kind.name()
                ),
            );
            return quote!(#item)
                .into_iter()
                .chain(errors.into_compile_error())
                .collect();
        }
    };

    if kind == Kind::Retry && expanded_by_idempotent(&func) {
        errors.at(Span::call_site(), RETRY_OUTSIDE_IDEMPOTENT);
        let errors = errors.into_compile_error();
        return quote!(#func #errors);
    }

    let mut retry = None;
    let mut idempotent = None;
    let mut idempotent_span = Span::call_site();
    match kind {
        Kind::Retry => retry = Some(args::retry(args, &mut errors)),
        Kind::Idempotent => idempotent = Some(args::idempotent(args, &mut errors)),
        Kind::Step => unreachable!("expanded by `step`"),
    }
    let mut taken = None;
    let mut kept = Vec::with_capacity(func.attrs.len());
    for attr in std::mem::take(&mut func.attrs) {
        match sibling(&attr) {
            Some(Kind::Retry) if retry.is_some() => errors.push(syn::Error::new_spanned(
                // The whole attribute, not only its `#`: stable Rust cannot join spans.
                &attr,
                format!(
                    "`#[retry]` is given twice on `{}`; merge their arguments into one",
                    func.sig.ident
                ),
            )),
            Some(Kind::Retry) => {
                retry = Some(args::retry(attr_args(&attr, &mut errors), &mut errors));
                taken = Some(attr.path().clone());
            }
            Some(Kind::Idempotent) if idempotent.is_some() => errors.push(syn::Error::new_spanned(
                // The whole attribute, not only its `#`: stable Rust cannot join spans.
                &attr,
                format!(
                    "`#[idempotent]` is given twice on `{}`; merge their arguments into one",
                    func.sig.ident
                ),
            )),
            Some(Kind::Idempotent) => {
                idempotent_span = attr.span();
                idempotent = Some(args::idempotent(attr_args(&attr, &mut errors), &mut errors));
                taken = Some(attr.path().clone());
            }
            // A `#[step]` beside is the step's own misuse, reported when it expands.
            Some(Kind::Step) | None => kept.push(attr),
        }
    }
    func.attrs = kept;

    validate::function(&func, kind.name(), &mut errors);
    if let Some(r) = &retry {
        validate::retry(r, &mut errors);
    }
    if let Some(i) = &idempotent {
        validate::idempotent(&func, i, idempotent_span, &mut errors);
    }
    if let (Some(r), Some(i)) = (&retry, &idempotent) {
        validate::one_name(r, i, &mut errors);
    }
    // The sibling, already expanded here, is written back with a marker that makes it return
    // the function as it is: its path stays in the code, so its import counts as used.
    if let Some(path) = taken {
        func.attrs
            .push(syn::parse_quote!(#[#path(__jobguard_expanded)]));
    }
    if !errors.is_empty() {
        let errors = errors.into_compile_error();
        return quote!(#func #errors);
    }
    expand(func, retry.as_ref(), idempotent.as_ref())
}

/// `#[step]`: checks the function and expands it into one call of the runtime's `step`. With
/// `#[retry]` below it, the two are written back in the other order, so that `#[retry]`
/// expands first and the step wraps the retry loop: its attempts are one occurrence of the
/// step, and only the final `Ok` is recorded.
fn step(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut errors = Errors::default();
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            errors.at(
                Span::call_site(),
                "`#[step]` goes on an `async fn` returning `Result`",
            );
            return quote!(#item)
                .into_iter()
                .chain(errors.into_compile_error())
                .collect();
        }
    };
    let step = args::step(args.clone(), &mut errors);
    let krate = step
        .krate
        .clone()
        .map(Path::into_token_stream)
        .unwrap_or_else(|| quote!(::jobguard));
    if errors.is_empty()
        && let Some(at) = func
            .attrs
            .iter()
            .position(|a| sibling(a) == Some(Kind::Retry))
    {
        let retry = func.attrs.remove(at);
        return quote! {
            #retry
            #[#krate::step(#args)]
            #func
        };
    }
    validate::function(&func, "step", &mut errors);
    let idempotent = func
        .attrs
        .iter()
        .find(|a| sibling(a) == Some(Kind::Idempotent));
    if let Some(attr) = idempotent {
        errors.push(syn::Error::new_spanned(attr, STEP_ON_A_JOB));
    } else if expanded_by_idempotent(&func) {
        errors.at(Span::call_site(), STEP_ON_A_JOB);
    }
    if !errors.is_empty() {
        let errors = errors.into_compile_error();
        return quote!(#func #errors);
    }
    step_call(func, &step, &krate)
}

/// A step is one effect inside a job, and `#[idempotent]` makes a job.
const STEP_ON_A_JOB: &str = "`#[step]` and `#[idempotent]` on one function: a step is one \
    effect inside a job, recorded under the job's key; put `#[step]` on the effect and \
    `#[idempotent]` on the job that calls it";

// Input:
//     #[step(name = "capture.v1")]
//     async fn capture(order: &Order) -> Result<Payment, GatewayError> { body }
//
// Output (macros/tests/expand/step.expanded.rs has it exactly):
//     async fn capture(order: &Order) -> Result<Payment, GatewayError> {
//         ::jobguard::__private::step("capture.v1", async { body }).await
//     }
//
// Without `name`, the step is named after the function (`"capture"`).
fn step_call(func: ItemFn, step: &StepArgs, krate: &TokenStream) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let ReturnType::Type(_, ret) = &sig.output else {
        unreachable!("validated: returns Result")
    };
    let name = match &step.name {
        Some(name) => quote!(#name),
        None => {
            let name = sig.ident.unraw().to_string();
            quote!(#name)
        }
    };
    let work = attempt_block(&block, ret);
    // On the return type, where a bound the `Ok` or error type misses is reported once.
    let call = respanned(&quote!(#krate::__private::step), ret.span());
    let mut body = proc_macro2::Group::new(
        proc_macro2::Delimiter::Brace,
        quote_spanned!(ret.span()=> #call(#name, #work).await),
    );
    body.set_span(block.brace_token.span.join());
    quote! {
        #(#attrs)*
        #vis #sig #body
    }
}

/// The argument a sibling is written back with once it has been expanded.
fn is_expanded_marker(args: &TokenStream) -> bool {
    let mut tokens = args.clone().into_iter();
    matches!(
        (tokens.next(), tokens.next()),
        (Some(proc_macro2::TokenTree::Ident(i)), None) if i == "__jobguard_expanded"
    )
}

/// `#[retry]` written above a renamed `#[idempotent]` is found by neither: `#[idempotent]`
/// expands first, and `#[retry]` receives its expansion, which it would wrap in the loop.
const RETRY_OUTSIDE_IDEMPOTENT: &str = "`#[retry]` must be inside `#[idempotent]`, and here it \
    would wrap a function `#[idempotent]` has expanded already, so every attempt would claim the \
    key anew; jobguard could not tell the two attributes apart because one is imported under \
    another name: import them as `idempotent` and `retry` (`use jobguard::{idempotent, retry};`), \
    or write `#[jobguard::idempotent]` and `#[jobguard::retry]`";

/// Whether `func` is the expansion of `#[idempotent]`: its body binds `__jobguard_idempotent`
/// (`let __jobguard_idempotent = ...;`, or inside `__private::transaction! { ... }`). No user
/// code names it, so the binding marks the expansion without adding anything to it.
fn expanded_by_idempotent(func: &ItemFn) -> bool {
    let binds = |pat: &syn::Pat| matches!(pat, syn::Pat::Ident(p) if p.ident == IDEMPOTENT_BINDING);
    func.block.stmts.iter().any(|stmt| match stmt {
        syn::Stmt::Local(local) => binds(&local.pat),
        syn::Stmt::Macro(syn::StmtMacro { mac, .. })
        | syn::Stmt::Expr(syn::Expr::Macro(syn::ExprMacro { mac, .. }), _) => {
            mac.path
                .segments
                .last()
                .is_some_and(|s| s.ident == "transaction")
                && mac.tokens.clone().into_iter().any(
                    |t| matches!(&t, proc_macro2::TokenTree::Ident(i) if i == IDEMPOTENT_BINDING),
                )
        }
        _ => false,
    })
}

/// The binding that holds the claim in `#[idempotent]`'s expansion.
const IDEMPOTENT_BINDING: &str = "__jobguard_idempotent";

/// `#[retry]`, `#[jobguard::retry]`, `#[idempotent]`, `#[jobguard::idempotent]` (or under a
/// re-exporting path that names `jobguard`).
fn sibling(attr: &Attribute) -> Option<Kind> {
    let path = attr.path();
    let last = path.segments.last()?;
    let ours = path.segments.len() == 1 || path.segments.iter().any(|s| s.ident == "jobguard");
    match () {
        _ if !ours => None,
        _ if last.ident == "retry" => Some(Kind::Retry),
        _ if last.ident == "idempotent" => Some(Kind::Idempotent),
        _ => None,
    }
}

fn attr_args(attr: &Attribute, errors: &mut Errors) -> TokenStream {
    match &attr.meta {
        Meta::Path(_) => TokenStream::new(),
        Meta::List(list) => list.tokens.clone(),
        Meta::NameValue(nv) => {
            errors.at(
                nv.span(),
                "write the arguments in parentheses: `#[retry(attempts = 3)]`",
            );
            TokenStream::new()
        }
    }
}

// Input:
//     #[idempotent(key = order_id)]
//     #[retry(attempts = 5, base = "500ms")]
//     async fn charge(order_id: &str) -> Result<Receipt, GatewayError> { body }
//
// Output (macros/tests/expand/*.expanded.rs has it exactly, for several shapes):
//     async fn charge(order_id: &str) -> Result<Receipt, GatewayError> {
//         static __JOBGUARD_SCOPE: DefaultScope =       // only for the default scope: a
//             DefaultScope::new(concat!(module_path!(), "::charge"));  // pinned one is as written
//         let __jobguard_key = ::jobguard::__private::key(&(order_id));
//         let __jobguard_idempotent = ::jobguard::__private::Idempotent::new(
//             __JOBGUARD_SCOPE.name(), &__jobguard_key)
//             .default_scope(&__JOBGUARD_SCOPE);      // checked to be this function's alone
//         __jobguard_idempotent
//             .run(async {
//                 static __JOBGUARD_JOB: Job = Job::new(concat!(module_path!(), "::charge"));
//                 const __JOBGUARD_POLICY: Policy =      // `let __jobguard_policy` when an
//                     Policy::new().attempts(5)          // argument is not a literal
//                         .base(Duration::from_millis(500));
//                 let __jobguard_spec: Spec<'_> =       // a `static __JOBGUARD_SPEC` when it
//                     Spec::of(&__JOBGUARD_JOB, &__JOBGUARD_POLICY)  // has no key, sink or
//                         .key(&__jobguard_key);      // payload, and a `const` policy
//                 let mut __jobguard_retry =          // the call's state; `Guard::of(..)`
//                     Retry::new(&__jobguard_spec, Guard::none());  // with a breaker, a
//                                                   // timeout or a budget; then
//                                                   // `.retry_budget(..)` with one
//                 loop {
//                     if let ControlFlow::Break(__jobguard_done) = __jobguard_retry
//                         .round(async { body }, transient, accept)  // one attempt, its error
//                         .await                                     // and `Ok` classifiers
//                     {
//                         break __jobguard_done;
//                     }
//                 }
//             })
//             .await
//     }
fn expand(
    func: ItemFn,
    retry: Option<&RetryArgs>,
    idempotent: Option<&IdempotentArgs>,
) -> TokenStream {
    let krate = retry
        .and_then(|r| r.krate.clone())
        .or_else(|| idempotent.and_then(|i| i.krate.clone()))
        .map(Path::into_token_stream)
        .unwrap_or_else(|| quote!(::jobguard));
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let ReturnType::Type(_, ret) = &sig.output else {
        unreachable!("validated: returns Result")
    };
    // One name per job, used by metrics, tracing, events, dead letters and the store: the
    // pinned `scope` or `name`, else the function's module path and name.
    let (job, default_scope) = match (
        retry.and_then(|r| r.name.as_ref()),
        idempotent.and_then(|i| i.scope.as_ref()),
    ) {
        (_, Some(pinned)) | (Some(pinned), None) => (quote!(#pinned), false),
        (None, None) => {
            let name = format!("::{}", sig.ident.unraw());
            (quote!(::core::concat!(::core::module_path!(), #name)), true)
        }
    };
    let brace = block.brace_token.span.join();

    let outer = match (retry, idempotent) {
        (Some(r), None) => retry_loop(
            r,
            &krate,
            &job,
            ret,
            Attempt::Stmts(attempt_stmts(&block, ret)),
            false,
        ),
        (None, Some(i)) => idempotent_call(
            i,
            Letters::default(),
            default_scope,
            &krate,
            &job,
            ret,
            attempt_block(&block, ret),
        ),
        (Some(r), Some(i)) => {
            // In a transaction, the attempts share one savepoint, made before the loop: each
            // later attempt starts by rolling back to it (an earlier one may have been cut by a
            // timeout, its writes still there), and it is released after the loop.
            let body = match &i.transaction {
                Some(tx) => {
                    let stmts = attempt_stmts(&block, ret);
                    // On the return type, where `Idempotent`'s own bounds are reported: a missing
                    // `From<jobguard::Error>` is one error.
                    let attempt = Ident::new("attempt", ret.span());
                    Attempt::Future(quote_spanned! {ret.span()=>
                        __jobguard_savepoint.#attempt(
                            &mut *#tx,
                            async |#tx: &mut #krate::__private::PgConnection| { #stmts },
                        )
                    })
                }
                None => Attempt::Stmts(attempt_stmts(&block, ret)),
            };
            let inner = retry_loop(r, &krate, &job, ret, body, true);
            let inner = match &i.transaction {
                Some(tx) => {
                    let savepoint = respanned(&quote!(#krate::__private::Savepoint), ret.span());
                    let finish = Ident::new("finish", ret.span());
                    let done = quote_spanned! {ret.span()=>
                        __jobguard_savepoint.#finish(&mut *#tx, __jobguard_done).await
                    };
                    quote! {
                        let mut __jobguard_savepoint = #savepoint::new();
                        let __jobguard_done = { #inner };
                        #done
                    }
                }
                None => inner,
            };
            // The crash letter goes where the job's other letters go, with the same payload.
            let letters = Letters {
                sink: r.dead_letter.is_some(),
                payload: r.payload.is_some(),
            };
            idempotent_call(
                i,
                letters,
                default_scope,
                &krate,
                &job,
                ret,
                quote!(async { #inner }),
            )
        }
        (None, None) => unreachable!("one attribute is expanding"),
    };
    // The job's sink is evaluated once per call, for the retry's letters and the crash letter
    // alike; through a call, as the breaker, so that a temporary is not kept alive by a `let`.
    let sink = retry
        .and_then(|r| r.dead_letter.as_ref())
        .map(|d| quote_spanned!(d.span()=> let __jobguard_sink = #krate::__private::sink(&#d);));
    let payload = retry.and_then(|r| payload_binding(r, &krate));
    // The body's braces are the user's: the item then spans the user's tokens alone, so rustc
    // treats it as the user's and lints it as such (an uncalled function is `dead_code`).
    let mut body = proc_macro2::Group::new(
        proc_macro2::Delimiter::Brace,
        quote! {
            #sink
            #payload
            #outer
        },
    );
    body.set_span(brace);
    quote! {
        #(#attrs)*
        #vis #sig #body
    }
}

/// The body as one attempt: an `async` block in which `return` and `?` keep their meaning. The
/// `if false { return <R> }` edge (tracing-attributes' trick) tells inference the block's output
/// type, so `?` converts errors as it does in the function, and type errors land on the
/// function's return type.
fn attempt_block(block: &Block, ret: &Type) -> TokenStream {
    Attempt::Stmts(attempt_stmts(block, ret)).into_block()
}

/// The body's statements behind the return-type edge of [`attempt_block`].
fn attempt_stmts(block: &Block, ret: &Type) -> TokenStream {
    let stmts = &block.stmts;
    let edge = if contains_impl_trait(ret) {
        quote!()
    } else {
        quote_spanned! {ret.span()=>
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::let_unit_value,
                clippy::unreachable,
                clippy::empty_loop,
                clippy::needless_return
            )]
            if false {
                let __jobguard_return: #ret = loop {};
                return __jobguard_return;
            }
        }
    };
    quote! {
        #edge
        #(#stmts)*
    }
}

fn contains_impl_trait(ty: &Type) -> bool {
    ty.to_token_stream()
        .into_iter()
        .any(|t| matches!(&t, proc_macro2::TokenTree::Ident(i) if i == "impl"))
        || ty.to_token_stream().to_string().contains("impl ")
}

fn duration(arg: &DurationArg) -> TokenStream {
    match arg {
        DurationArg::Literal(d, span) => {
            let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
            let lit_secs = Literal::u64_unsuffixed(secs);
            if nanos == 0 {
                quote_spanned!(*span=> ::core::time::Duration::from_secs(#lit_secs))
            } else if nanos % 1_000_000 == 0 && secs < u64::MAX / 1000 {
                let ms = Literal::u64_unsuffixed(secs * 1000 + u64::from(nanos / 1_000_000));
                quote_spanned!(*span=> ::core::time::Duration::from_millis(#ms))
            } else {
                let nanos = Literal::u32_unsuffixed(nanos);
                quote_spanned!(*span=> ::core::time::Duration::new(#lit_secs, #nanos))
            }
        }
        DurationArg::Expr(e) => quote!(#e),
    }
}

/// `tokens` with every span set to `span`. A path such as `::jobguard` is resolved at the call
/// site either way; only where an error about it is reported changes.
fn respanned(tokens: &TokenStream, span: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(g) = &token {
                let mut group =
                    proc_macro2::Group::new(g.delimiter(), respanned(&g.stream(), span));
                group.set_span(span);
                token = group.into();
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// `let __jobguard_payload: &dyn Payload = &(&a, &b);`: the job's arguments for a dead letter,
/// borrowed, never moved (the body still owns them), once per call at the top of the function,
/// where both the retry's letters and, with `#[idempotent]`, the crash letter read them.
fn payload_binding(r: &RetryArgs, krate: &TokenStream) -> Option<TokenStream> {
    let p = r.payload.as_ref()?;
    let borrowed = match p {
        syn::Expr::Tuple(t) => {
            let elems = t.elems.iter();
            quote_spanned!(p.span()=> (#(&#elems,)*))
        }
        other => quote_spanned!(p.span()=> &#other),
    };
    // Typed once, on the payload's tokens: a payload that cannot be serialized is one error,
    // there, however many letters would carry it.
    Some(quote_spanned!(p.span()=>
        let __jobguard_payload: &dyn #krate::__private::Payload = &#borrowed;
    ))
}

/// The retry loop around `body`, the attempt: the body's statements (made into an `async`
/// block) or an expression that makes the attempt's future.
fn retry_loop(
    r: &RetryArgs,
    krate: &TokenStream,
    job: &TokenStream,
    ret: &Type,
    body: Attempt,
    keyed: bool,
) -> TokenStream {
    let mut policy = quote!(#krate::Policy::new());
    if let Some(a) = &r.attempts {
        policy.extend(quote!(.attempts(#a)));
    }
    for (setter, arg) in [
        ("base", &r.base),
        ("cap", &r.cap),
        ("budget", &r.budget),
        ("timeout", &r.timeout),
    ] {
        if let Some(arg) = arg {
            let setter = Ident::new(setter, Span::call_site());
            let d = duration(arg);
            policy.extend(quote!(.#setter(#d)));
        }
    }
    if let Some(j) = &r.jitter {
        let variant = Ident::new(
            match j.to_string().as_str() {
                "none" => "None",
                "full" => "Full",
                "equal" => "Equal",
                _ => "Decorrelated",
            },
            j.span(),
        );
        policy.extend(quote!(.jitter(#krate::Jitter::#variant)));
    }
    // A policy of literals is a `const`, so the call only borrows it; one that reads
    // expressions is made on each call.
    let literal = [&r.base, &r.cap, &r.budget, &r.timeout]
        .iter()
        .all(|d| d.as_ref().is_none_or(|d| d.literal().is_some()))
        && r.attempts
            .as_ref()
            .is_none_or(|a| matches!(a, syn::Expr::Lit(_)));
    let (policy, policy_name) = if literal {
        let name = quote!(__JOBGUARD_POLICY);
        (quote!(const #name: #krate::Policy = #policy;), name)
    } else {
        let name = quote!(__jobguard_policy);
        (quote!(let #name: #krate::Policy = #policy;), name)
    };
    let mut spec = quote!(#krate::__private::Spec::of(&__JOBGUARD_JOB, &#policy_name));
    if keyed {
        spec.extend(quote!(.key(&__jobguard_key)));
    }
    if r.dead_letter.is_some() {
        spec.extend(quote!(.dead_letter(__jobguard_sink)));
    }
    // The payload is bound once per call at the top of the function (see `payload_binding`).
    if let Some(p) = &r.payload {
        spec.extend(quote_spanned!(p.span()=> .payload(__jobguard_payload)));
    }
    // What the call reads of its job is one `static` when nothing in it is made per call, so
    // that a call stores one pointer for all of it.
    let per_call = !literal || keyed || r.dead_letter.is_some() || r.payload.is_some();
    let (spec, spec_name) = if per_call {
        let name = quote!(__jobguard_spec);
        (
            quote!(let #name: #krate::__private::Spec<'_> = #spec;),
            name,
        )
    } else {
        let name = quote!(__JOBGUARD_SPEC);
        (
            quote!(static #name: #krate::__private::Spec<'static> = #spec;),
            name,
        )
    };
    // The breaker is evaluated once per call and handed to the call's guard. Through a call,
    // not a `let` of a reference: a `const` breaker (a new one wherever it is named, never
    // tripping across calls) stays a compile error, as a temporary dropped while borrowed.
    let breaker_once = r.breaker.as_ref().map(
        |b| quote_spanned!(b.span()=> let __jobguard_breaker = #krate::__private::breaker(&#b);),
    );
    let timed = r.timeout.is_some() || r.budget.is_some();
    // On the return type, where a bound the error type misses (`From<jobguard::Error>` when
    // something of jobguard's can fail the attempt) is reported once.
    let guard = respanned(&quote!(#krate::__private::Guard), ret.span());
    let guard = match (&r.breaker, timed) {
        (Some(_), _) => {
            quote_spanned!(ret.span()=> #guard::of(::core::option::Option::Some(__jobguard_breaker)))
        }
        (None, true) => quote_spanned!(ret.span()=> #guard::of(::core::option::Option::None)),
        (None, false) => quote_spanned!(ret.span()=> #guard::none()),
    };
    // The retry budget, like the breaker, is evaluated once per call, through a call that
    // makes anything but a `RetryBudget` an error in words on its expression.
    let budget_once = r.retry_budget.as_ref().map(|b| {
        let krate = respanned(krate, b.span());
        quote_spanned!(b.span()=> let __jobguard_retry_budget = #krate::__private::retry_budget(&#b);)
    });
    let guard = match &r.retry_budget {
        Some(_) => quote!(#guard.retry_budget(__jobguard_retry_budget)),
        None => guard,
    };
    // Each path carries, `krate` included, the span of the tokens it is about: a path whose
    // tokens mix spans is reported on the whole attribute.
    let classify = match &r.on {
        None => {
            let krate = respanned(krate, ret.span());
            quote_spanned!(ret.span()=> #krate::__private::transient)
        }
        Some(On::Transient(span)) => {
            let span = ret.span().join(*span).unwrap_or_else(|| ret.span());
            let krate = respanned(krate, span);
            quote_spanned!(span=> #krate::__private::transient)
        }
        Some(On::All(span)) => quote_spanned!(*span=> #krate::__private::all),
        // Through a closure, so that a classifier of the wrong type is one error, on its path,
        // and the round the loop awaits is well-typed whatever the path names.
        Some(On::Classifier(f)) => {
            let krate = respanned(krate, f.span());
            quote_spanned! {f.span()=>
                |__jobguard_error: &_| #krate::__private::classify(#f, __jobguard_error)
            }
        }
    };
    let on_ok = match &r.on_ok {
        Some(k) => {
            let krate = respanned(krate, k.span());
            quote_spanned! {k.span()=>
                |__jobguard_value: &_| #krate::__private::classify_ok(#k, __jobguard_value)
            }
        }
        None => quote!(#krate::__private::accept),
    };
    let retry = respanned(&quote!(#krate::__private::Retry), ret.span());
    let body = body.into_block();
    // The round carries the return type's span: a bound the error type misses (`Transient`,
    // `Display`) is then reported once, there, rather than once there and again on the whole
    // attribute.
    let round = quote_spanned!(ret.span()=> __jobguard_retry.round(#body, #classify, #on_ok).await);
    quote! {
        static __JOBGUARD_JOB: #krate::__private::Job = #krate::__private::Job::new(#job);
        #policy
        #spec
        #breaker_once
        #budget_once
        let mut __jobguard_retry = #retry::new(&#spec_name, #guard);
        loop {
            if let ::core::ops::ControlFlow::Break(__jobguard_done) = #round {
                break __jobguard_done;
            }
        }
    }
}

/// The attempt a retry loop runs: the body's statements, or an expression that makes the
/// attempt's future (a transaction's savepoint around the statements).
enum Attempt {
    Stmts(TokenStream),
    Future(TokenStream),
}

impl Attempt {
    /// The attempt as an expression, an `async` block for the statements.
    fn into_block(self) -> TokenStream {
        match self {
            Attempt::Stmts(stmts) => quote!(async { #stmts }),
            Attempt::Future(future) => future,
        }
    }
}

/// What of `#[retry]`'s dead letters the crash letter of `#[idempotent]` shares: its sink
/// (`__jobguard_sink`) and its payload (`__jobguard_payload`), both bound at the function's top.
#[derive(Default, Clone, Copy)]
struct Letters {
    sink: bool,
    payload: bool,
}

/// `default_scope`: the scope is the function's module path and name, not pinned, so the call
/// checks (through a `static` of the function's) that no other function has it.
fn idempotent_call(
    i: &IdempotentArgs,
    letters: Letters,
    default_scope: bool,
    krate: &TokenStream,
    job: &TokenStream,
    ret: &Type,
    work: TokenStream,
) -> TokenStream {
    let key = i.key.as_ref().expect("validated: key is present");
    let scope = Scope::of(default_scope, krate, job);
    if let Some(tx) = &i.transaction {
        return transaction_call(i, krate, scope, ret, tx, work);
    }
    let Scope { item, name, check } = scope;
    let mut call = quote!(#krate::__private::Idempotent::new(#name, &__jobguard_key) #check);
    if let Some(ttl) = &i.ttl {
        let d = duration(ttl);
        call.extend(quote!(.ttl(#d)));
    }
    if let Some(lease) = &i.lease {
        let d = duration(lease);
        call.extend(quote!(.lease(#d)));
    }
    if let Some(crashes) = &i.crashes {
        let n = crashes.base10_digits();
        let n = syn::LitInt::new(&format!("{n}u32"), crashes.span());
        call.extend(quote!(.crashes(#n)));
    }
    match &i.in_progress {
        Some(InProgress::Wait(d)) => {
            let d = duration(d);
            call.extend(quote!(.wait(#d)));
        }
        Some(InProgress::Fail) | None => {}
    }
    if let Some(fp) = &i.fingerprint {
        call.extend(
            quote_spanned!(fp.span()=> .fingerprint(#krate::__private::fingerprint(&(#fp)))),
        );
    }
    if let Some(store) = &i.store {
        call.extend(quote_spanned!(store.span()=> .store(&#store)));
    }
    if letters.sink {
        call.extend(quote!(.dead_letter(__jobguard_sink)));
    }
    if letters.payload {
        call.extend(quote!(.payload(__jobguard_payload)));
    }
    let run = Ident::new("run", ret.span());
    // Each bound is reported on the tokens it is about: the key's on the key expression, the
    // `Ok` and error types' on the return type.
    let key = quote_spanned!(key.span()=> #krate::__private::key(&(#key)));
    let run = quote_spanned!(ret.span()=> __jobguard_idempotent.#run(#work).await);
    quote! {
        #item
        let __jobguard_key = #key;
        let __jobguard_idempotent = #call;
        #run
    }
}

/// The scope's tokens in an idempotent call.
struct Scope {
    /// With the default scope, the `static` that holds it; nothing for a pinned one.
    item: TokenStream,
    /// The scope's name: read from the `static`, or the pinned one as written.
    name: TokenStream,
    /// With the default scope, the builder call that checks it is this function's alone.
    check: TokenStream,
}

impl Scope {
    fn of(default_scope: bool, krate: &TokenStream, job: &TokenStream) -> Scope {
        if !default_scope {
            return Scope {
                item: TokenStream::new(),
                name: job.clone(),
                check: TokenStream::new(),
            };
        }
        Scope {
            item: quote! {
                static __JOBGUARD_SCOPE: #krate::__private::DefaultScope =
                    #krate::__private::DefaultScope::new(#job);
            },
            name: quote!(__JOBGUARD_SCOPE.name()),
            check: quote!(.default_scope(&__JOBGUARD_SCOPE)),
        }
    }
}

// Input:
//     #[idempotent(key = transfer.id, transaction = tx)]
//     async fn transfer(tx: &mut PgConnection, transfer: &Transfer) -> Result<Receipt, E> { body }
//
// Output:
//     async fn transfer(tx: &mut PgConnection, transfer: &Transfer) -> Result<Receipt, E> {
//         ::jobguard::__private::transaction! {
//             let __jobguard_key = ::jobguard::__private::key(&(transfer.id));
//             let __jobguard_idempotent = ::jobguard::__private::PgStore::in_transaction(
//                 &mut *tx, concat!(module_path!(), "::transfer"), &__jobguard_key);
//             __jobguard_idempotent
//                 .run(async |tx: &mut ::jobguard::__private::PgConnection| async { body }.await)
//                 .await
//         }
//     }
//
// `transaction!` passes the statements through with jobguard's `postgres` feature; without it,
// it replaces them with one error in words, instead of rustc's "not found in `__private`".
//
// The body sees `tx` as the `&mut PgConnection` the call hands back, whichever of the two types
// the parameter has. With `#[retry]`, the work is the retry loop, its attempts in one savepoint
// (`__private::Savepoint`) made before the loop and ended after it.
fn transaction_call(
    i: &IdempotentArgs,
    krate: &TokenStream,
    Scope { item, name, check }: Scope,
    ret: &Type,
    tx: &syn::Expr,
    work: TokenStream,
) -> TokenStream {
    let key = i.key.as_ref().expect("validated: key is present");
    let mut call = quote!(
        #krate::__private::PgStore::in_transaction(&mut *#tx, #name, &__jobguard_key) #check
    );
    if let Some(ttl) = &i.ttl {
        let d = duration(ttl);
        call.extend(quote!(.ttl(#d)));
    }
    if let Some(fp) = &i.fingerprint {
        call.extend(
            quote_spanned!(fp.span()=> .fingerprint(#krate::__private::fingerprint(&(#fp)))),
        );
    }
    let run = Ident::new("run", ret.span());
    let key = quote_spanned!(key.span()=> #krate::__private::key(&(#key)));
    let run = quote_spanned!(ret.span()=> __jobguard_idempotent.#run(
        async |#tx: &mut #krate::__private::PgConnection| #work.await
    ).await);
    // Through the runtime's `transaction!`, which passes the statements through with the
    // `postgres` feature and replaces them with an error in words without it.
    let pass = quote_spanned!(tx.span()=> #krate::__private::transaction!);
    quote! {
        #pass {
            #item
            let __jobguard_key = #key;
            let __jobguard_idempotent = #call;
            #run
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Kind, attribute, expanded_by_idempotent};
    use proc_macro2::TokenStream;

    fn expand(kind: Kind, args: &str, item: &str) -> TokenStream {
        attribute(kind, args.parse().unwrap(), item.parse().unwrap())
    }

    const JOB: &str = "async fn job(id: &str) -> Result<u32, E> { Ok(1) }";
    const TX_JOB: &str =
        "async fn job(tx: &mut PgConnection, id: &str) -> Result<u32, E> { Ok(1) }";

    #[test]
    fn idempotent_expansions_are_recognised() {
        for (args, item) in [
            ("key = id", JOB),
            (r#"key = id, ttl = "1h", in_progress = wait("2s")"#, JOB),
            ("key = id, transaction = tx", TX_JOB),
        ] {
            let out = expand(Kind::Idempotent, args, item);
            let func: syn::ItemFn = syn::parse2(out).unwrap();
            assert!(expanded_by_idempotent(&func), "{args}");
        }
        let retried: syn::ItemFn = syn::parse2(expand(Kind::Retry, "attempts = 3", JOB)).unwrap();
        assert!(!expanded_by_idempotent(&retried));
        assert!(!expanded_by_idempotent(&syn::parse_str(JOB).unwrap()));
    }

    // `use jobguard::{idempotent as once, retry as with_retry}`, then `#[once(key = id)]` above
    // `#[with_retry]`: `#[with_retry]` is not taken as the sibling, and receives the expansion.
    #[test]
    fn retry_outside_an_expanded_idempotent_is_an_error() {
        let item = format!("#[with_retry(attempts = 3)] {JOB}");
        let once = expand(Kind::Idempotent, "key = id", &item);
        let mut func: syn::ItemFn = syn::parse2(once).unwrap();
        assert_eq!(
            func.attrs.len(),
            1,
            "`#[with_retry]` is kept for rustc to expand"
        );
        func.attrs.clear();
        let body = quote::quote!(#func).to_string();
        let out = expand(Kind::Retry, "attempts = 3", &body).to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("must be inside"), "{out}");
    }
}
