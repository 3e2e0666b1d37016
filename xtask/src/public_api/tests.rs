use super::line_diff;

#[test]
fn an_unchanged_api_has_no_diff() {
    let api = "pub mod m\npub fn m::f()\n";
    assert_eq!(line_diff(api, api), "");
}

#[test]
fn removed_lines_come_first_then_added_ones_in_file_order() {
    let snapshot = "pub mod m\npub fn m::a()\npub fn m::b() -> u8\npub fn m::c()\n";
    let current = "pub mod m\npub fn m::b() -> u16\npub fn m::c()\npub fn m::d()\n";
    assert_eq!(
        line_diff(snapshot, current),
        "-pub fn m::a()\n-pub fn m::b() -> u8\n+pub fn m::b() -> u16\n+pub fn m::d()\n"
    );
}

#[test]
fn a_repeated_line_counts_each_time() {
    // public-api can render two items alike (e.g. an impl under two paths): losing one of the
    // two is a change.
    let snapshot = "impl Send for m::T\nimpl Send for m::T\n";
    let current = "impl Send for m::T\n";
    assert_eq!(line_diff(snapshot, current), "-impl Send for m::T\n");
    assert_eq!(line_diff(current, snapshot), "+impl Send for m::T\n");
}

#[test]
fn json_of_another_format_is_refused_with_what_to_do() {
    let dir = std::env::temp_dir().join(format!("xtask-public-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("krate.json");
    std::fs::write(&json, r#"{"root":0,"index":{},"format_version":12}"#).unwrap();
    let err = super::check_format(&json, "nightly-old")
        .unwrap_err()
        .to_string();
    std::fs::write(
        &json,
        format!(
            r#"{{"index":{{}},"format_version":{}}}"#,
            rustdoc_types::FORMAT_VERSION
        ),
    )
    .unwrap();
    let same = super::check_format(&json, "nightly");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        err.contains("`nightly-old`'s rustdoc writes JSON format 12"),
        "{err}"
    );
    assert!(err.contains(super::PINNED_NIGHTLY), "{err}");
    same.unwrap();
}
