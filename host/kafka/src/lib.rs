//! Kafka in and out for Statebox: a source reading topics by offset ranges the engine plans
//! and logs, and a transactional sink that delivers each batch exactly once.
