//! The HTML pages.

use super::Console;
use axum::Router;
use std::sync::Arc;

pub(super) fn routes() -> Router<Arc<Console>> {
    Router::new()
}
