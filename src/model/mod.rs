//! Identities, locations and records shared by every role.
