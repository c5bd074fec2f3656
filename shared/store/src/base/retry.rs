//! Task retry backoff (SPEC §5): the one policy of palisade, defined beside the wire contract
//! because the protocol's retry rules state it.

pub use messages::retry::RetryPolicy;
