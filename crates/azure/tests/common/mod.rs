//! What the Service Bus test binaries share: queues declared through the stand-in's
//! control endpoint, as infrastructure declares them for Service Bus.
#![allow(dead_code, clippy::unwrap_used)]

use async_trait::async_trait;
use orderly_azure::QueueAdmin;
use orderly_core::transport::{QueueName, QueueSettings, TransportError};
use orderly_testkit::servicebus_standin::{post, post_for_body};

/// Declares queues on the stand-in whose control port it holds.
pub struct StandinAdmin(pub u16);

#[async_trait]
impl QueueAdmin for StandinAdmin {
    async fn declare(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError> {
        let body = serde_json::json!({
            "lock_ms": settings.lock_duration.as_millis() as u64,
            "max_delivery_count": settings.max_delivery_count,
            "dedup_ms": settings.duplicate_detection_window.as_millis() as u64,
        })
        .to_string();
        post(self.0, &format!("/queues/{}", queue.as_str()), &body)
            .map_err(|e| TransportError::Unavailable(e.into()))
    }

    async fn ensure(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<bool, TransportError> {
        let body = serde_json::json!({
            "lock_ms": settings.lock_duration.as_millis() as u64,
            "max_delivery_count": settings.max_delivery_count,
            "dedup_ms": settings.duplicate_detection_window.as_millis() as u64,
        })
        .to_string();
        let answer = post_for_body(
            self.0,
            &format!("/queues/{}?if-missing", queue.as_str()),
            &body,
        )
        .map_err(|e| TransportError::Unavailable(e.into()))?;
        Ok(answer.contains("\"created\":true"))
    }
}
