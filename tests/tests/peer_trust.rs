//! Peer trust (issue 61): what the agent believes, and from whom.

#[path = "peer_trust/config_files.rs"]
mod config_files;

#[path = "peer_trust/hostile.rs"]
mod hostile;
