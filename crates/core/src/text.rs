//! Small text helpers shared by services.

/// At most `max` characters of `text`, marked with `...` when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let head: String = text.chars().take(max.saturating_sub(3)).collect();
    format!("{head}...")
}

#[cfg(test)]
mod tests {
    #[test]
    fn clips_by_characters() {
        assert_eq!(super::clip("short", 10), "short");
        assert_eq!(super::clip("ééééééé", 5), "éé...");
    }
}
