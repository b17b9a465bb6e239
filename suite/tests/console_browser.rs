//! The console's pages in a real browser: headless Chromium over WebDriver (Debian's `chromium`
//! and `chromium-driver`; skipped with a reason when they are missing, unless
//! `JOBGUARD_REQUIRE_CHROMIUM=1`). An operator opens the dead letters, filters them, redrives
//! one from its page, bulk-deletes the rest of the filter after the confirmation page, then
//! looks up a poisoned key and forgives it. Each step's screenshot is saved under
//! `target/console/`.

mod console_support;

use console_support::{SCOPE, console, letter, listening, poison, serve};
use jobguard::dead_letter::{Browse, Filter};
use jobguard::{DeadLetterSink, MemoryDeadLetters, MemoryStore, StoreKey};
use jobguard_testkit::chromium::{Chromedriver, Session};
use std::path::PathBuf;

/// How many letters the page starts with: `letter(0..30)`.
const N: usize = 30;

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console");
    std::fs::create_dir_all(&dir).expect("target/console");
    dir
}

fn shot(browser: &Session<'_>, name: &str) {
    let path = shots().join(format!("{name}.png"));
    std::fs::write(&path, browser.screenshot()).expect("write the screenshot");
    println!("screenshot: {}", path.display());
}

#[test]
fn an_operator_filters_redrives_bulk_deletes_and_forgives_in_a_browser() {
    let Some(driver) = Chromedriver::start() else {
        return;
    };
    // The console's server on a runtime of its own, so that this thread may block on the
    // browser while the server answers it.
    let server = tokio::runtime::Runtime::new().unwrap();
    let letters = MemoryDeadLetters::new();
    let store = MemoryStore::new();
    let (runtime, heard) = listening();
    let (console, ran) = console(letters.clone(), store.clone(), runtime);
    let addr = server.block_on(async {
        for i in 0..N {
            letters.send(letter(i)).await.unwrap();
        }
        poison(
            &store,
            StoreKey {
                scope: SCOPE,
                key: "bad",
            },
        )
        .await;
        serve(axum::Router::new().nest("/jobguard", console.router())).await
    });
    let base = format!("http://{addr}/jobguard");
    let charges = |letters: &MemoryDeadLetters| {
        let filter = Filter::new().job("payments.charge");
        server.block_on(letters.count(&filter)).unwrap()
    };
    let all_charges = charges(&letters);
    assert_eq!(all_charges as usize, (0..N).filter(|i| i % 4 != 0).count());

    let browser = driver.session(1280, 900);
    // The list, newest first.
    browser.goto(&format!("{base}/dead-letters"));
    assert_eq!(browser.text_of("#count"), N.to_string());
    assert_eq!(browser.count("#letters tbody tr"), N);
    shot(&browser, "01-dead-letters");

    // Filter by job.
    browser.type_into(&browser.find("input[name=job]"), "payments.charge");
    browser.click(&browser.find("#apply"));
    assert!(
        browser.url().contains("job=payments.charge"),
        "{}",
        browser.url()
    );
    assert_eq!(browser.text_of("#count"), all_charges.to_string());
    assert_eq!(browser.count("#letters tbody tr"), all_charges as usize);
    shot(&browser, "02-filtered");

    // Open the newest and redrive it.
    browser.click(&browser.find("#letters tbody tr:first-child a"));
    assert!(browser.text_of("#letter").contains("k-29"));
    shot(&browser, "03-letter");
    browser.click(&browser.find("#redrive"));
    assert!(
        browser.text_of("#notice").starts_with("Redriven letter"),
        "{}",
        browser.text_of("#notice")
    );
    assert_eq!(*ran.lock().unwrap(), [29]);
    assert_eq!(charges(&letters), all_charges - 1);
    shot(&browser, "04-redriven");

    // Bulk-delete the rest of the filter, after the confirmation page shows their count.
    browser.goto(&format!("{base}/dead-letters?job=payments.charge"));
    browser.click(&browser.find("#bulk-delete"));
    assert_eq!(
        browser.text_of("#confirm-count"),
        (all_charges - 1).to_string()
    );
    shot(&browser, "05-confirm-delete");
    browser.click(&browser.find("#confirm"));
    let notice = browser.text_of("#notice");
    assert_eq!(notice, format!("Deleted {} letter(s).", all_charges - 1));
    assert_eq!(charges(&letters), 0);
    assert_eq!(
        letters.len(),
        N - all_charges as usize,
        "the other jobs' letters stay"
    );
    shot(&browser, "06-deleted");

    // A poisoned key, forgiven.
    browser.goto(&format!("{base}/keys?scope={SCOPE}&key=bad"));
    assert_eq!(browser.text_of("#state"), "poisoned");
    assert_eq!(browser.text_of("#crashes"), "1");
    shot(&browser, "07-poisoned-key");
    browser.click(&browser.find("#forgive"));
    assert!(browser.text_of("#notice").starts_with("Forgiven"));
    assert_eq!(browser.text_of("#state"), "free");
    shot(&browser, "08-forgiven");

    let heard = heard.lock().unwrap();
    let actions: Vec<&str> = heard.iter().map(|(a, ..)| a.as_str()).collect();
    assert_eq!(actions, ["redrive", "delete", "forgive"], "{heard:?}");
}
