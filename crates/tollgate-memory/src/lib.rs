//! Work in progress: see the workspace README.
