use thiserror::Error;

/// Everything that can be wrong with a profile, naming the file, the field
/// (as a JSON path) and the offending value.
#[derive(Debug, Error)]
pub enum ProfileError {
    #[error("{file}: cannot read profile: {message}")]
    Io { file: String, message: String },
    #[error("{file}: not a valid tiertp profile: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: field `{field}` = {value}: {reason}")]
    Invalid {
        file: String,
        field: String,
        value: String,
        reason: String,
    },
    #[error("profile {profile} has no TP level {tp} (it has {available:?})")]
    MissingTp { profile: String, tp: u32, available: Vec<u32> },
}
