//! Which route a request came from: the answers' shapes differ.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    Completion,
    Chat,
}
