//! What input must be, and how much of free text is kept: the lowest layer of the
//! domain, which every other module may use and which uses none of them.

/// Input that does not make a valid order (or id); the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ValidationError {
    /// The field at fault, as a path such as `lines[2].quantity`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ValidationError {
    /// A validation error for `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Longest free text (error, reason, step detail) stored; longer text is cut.
pub const MAX_TEXT_LEN: usize = 4_000;

/// Cuts free text to [`MAX_TEXT_LEN`] bytes on a character boundary.
pub fn bounded_text(text: &str) -> &str {
    if text.len() <= MAX_TEXT_LEN {
        return text;
    }
    let mut end = MAX_TEXT_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_text_cuts_on_a_character_boundary() {
        let long = "é".repeat(MAX_TEXT_LEN);
        let cut = bounded_text(&long);
        assert!(cut.len() <= MAX_TEXT_LEN);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
