// `on_ok` names a classifier of another type than the `Ok` value.
fn busy(status: &String) -> bool {
    status == "503"
}

#[jobguard::retry(attempts = 2, on_ok = busy)]
async fn poll() -> Result<u16, std::io::Error> {
    Ok(200)
}

fn main() {}
