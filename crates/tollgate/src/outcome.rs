//! The outcome of one policy for one request: a label of `tollgate_decisions_total`. A leaf
//! module: metrics, policies and results all name outcomes.

/// The outcome of one policy for one request: the `outcome` label of
/// `tollgate_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The store admitted it.
    Allowed,
    /// The store (or the deny cache) rejected it.
    Limited,
    /// A shadow policy would have rejected it; it was not rejected.
    ShadowLimited,
    /// The store failed and the policy fails open.
    FailedOpen,
    /// The store failed and the policy fails closed.
    FailedClosed,
    /// The store failed and the local fallback admitted it.
    FallbackAllowed,
    /// The store failed and the local fallback rejected it.
    FallbackLimited,
    /// The policy allowed, but another rule of the plan denied the request, so nothing was
    /// charged (all-or-nothing).
    NotCharged,
}

impl Outcome {
    /// Every outcome, in metric order.
    pub const ALL: [Outcome; 8] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ShadowLimited,
        Outcome::FailedOpen,
        Outcome::FailedClosed,
        Outcome::FallbackAllowed,
        Outcome::FallbackLimited,
        Outcome::NotCharged,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::FailedOpen => "failed_open",
            Outcome::FailedClosed => "failed_closed",
            Outcome::FallbackAllowed => "fallback_allowed",
            Outcome::FallbackLimited => "fallback_limited",
            Outcome::NotCharged => "not_charged",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}
