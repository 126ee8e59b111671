//! The generated protobuf messages and gRPC services (see `build.rs` and `proto/`).
#![allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]

/// Envoy's API packages.
pub mod envoy {
    /// `envoy.config`.
    pub mod config {
        /// `envoy.config.core`.
        pub mod core {
            /// `envoy.config.core.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    /// `envoy.extensions`.
    pub mod extensions {
        /// `envoy.extensions.common`.
        pub mod common {
            /// `envoy.extensions.common.ratelimit`.
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`.
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    /// `envoy.service`.
    pub mod service {
        /// `envoy.service.ratelimit`.
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    /// `envoy.type`.
    pub mod r#type {
        /// `envoy.type.v3`.
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
        }
    }
}

/// gRPC's own packages.
pub mod grpc {
    /// `grpc.health`.
    pub mod health {
        /// `grpc.health.v1`.
        pub mod v1 {
            tonic::include_proto!("grpc.health.v1");
        }
    }
}
