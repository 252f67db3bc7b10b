//! Logs to stderr and, in a build with the `otel` feature, spans to an OpenTelemetry
//! collector over OTLP/HTTP (protobuf), with the W3C trace context carried in message
//! properties so one order's spans form one trace across the processes it crosses.

use orderly_core::InstanceId;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::Common;

/// The standard variables that turn export on without `--otel-endpoint`.
const OTEL_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Keeps the exporter alive; dropping it (or [`Telemetry::shutdown`]) sends the spans
/// still buffered, waiting at most a few seconds for the collector.
#[must_use = "dropping it stops the export"]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        #[cfg(feature = "otel")]
        {
            self.provider.is_some()
        }
        #[cfg(not(feature = "otel"))]
        {
            false
        }
    }

    /// Sends what is buffered and stops the exporter. Later calls do nothing.
    pub fn shutdown(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take() {
            // Blocks this thread only; the exporter has its own.
            if let Err(e) = provider.shutdown_with_timeout(std::time::Duration::from_secs(5)) {
                tracing::warn!(error = %e, "OpenTelemetry: spans not all exported at shutdown");
            }
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Sets up logging for the role binary `service` (e.g. `orderly-scheduler`) from the
/// common settings: `ORDERLY_LOG` filters the log lines, `--log-json` makes them JSON,
/// and `--otel-endpoint` (or the standard `OTEL_EXPORTER_OTLP_ENDPOINT`) exports spans.
/// Errors name the setting.
pub fn init(service: &str, common: &Common, instance: &InstanceId) -> anyhow::Result<Telemetry> {
    let log_filter =
        EnvFilter::try_from_env("ORDERLY_LOG").unwrap_or_else(|_| crate::DEFAULT_LOG_FILTER.into());
    // Colours only for a person at a terminal: a log file or a collector gets plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt: Box<dyn Layer<Registry> + Send + Sync> = if common.log_json {
        fmt.json().with_filter(log_filter).boxed()
    } else {
        fmt.with_filter(log_filter).boxed()
    };
    let standard = OTEL_ENDPOINT_VARS
        .iter()
        .find(|v| std::env::var(v).is_ok_and(|s| !s.is_empty()));
    // Empty means unset, as for the standard variables (compose passes `${VAR:-}`).
    let endpoint = common
        .otel_endpoint
        .as_deref()
        .filter(|s| !s.trim().is_empty());
    let wanted = endpoint.is_some() || standard.is_some();
    // Checked in every build, exporting or not: a bad value is a bad setting.
    let filter = EnvFilter::try_new(&common.otel_filter).map_err(|e| {
        anyhow::anyhow!(
            "invalid --otel-filter / ORDERLY_OTEL_FILTER {:?}: {e}",
            common.otel_filter
        )
    })?;
    #[cfg(feature = "otel")]
    {
        let (otel, provider) = if wanted {
            let provider = otel::provider(service, endpoint, instance)?;
            let layer = otel::layer(&provider).with_filter(filter).boxed();
            orderly_core::tracecontext::install(Box::new(otel::W3c::default()));
            (Some(layer), Some(provider))
        } else {
            (None, None)
        };
        let layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> =
            std::iter::once(fmt).chain(otel).collect();
        tracing_subscriber::registry().with(layers).init();
        if provider.is_some() {
            tracing::info!(
                service,
                instance_id = %instance,
                endpoint = endpoint.unwrap_or("(from OTEL_EXPORTER_OTLP_*)"),
                "exporting spans to OpenTelemetry (OTLP/HTTP)"
            );
        }
        Ok(Telemetry { provider })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (service, instance, filter);
        if endpoint.is_some() {
            anyhow::bail!(
                "--otel-endpoint / ORDERLY_OTEL_ENDPOINT is set, but this build has no \
                 OpenTelemetry export: build with `--features otel` (the container image does)"
            );
        }
        tracing_subscriber::registry().with(fmt).init();
        if let (Some(var), true) = (standard, wanted) {
            tracing::warn!(
                variable = var,
                "this build has no OpenTelemetry export (feature `otel`): the variable is ignored"
            );
        }
        Ok(Telemetry {})
    }
}

#[cfg(feature = "otel")]
mod otel {
    use std::collections::BTreeMap;

    use anyhow::Context as _;
    use opentelemetry::KeyValue;
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use orderly_core::InstanceId;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::Registry;

    /// The traces URL for an OTLP/HTTP base endpoint (`http://collector:4318`), as the
    /// standard `OTEL_EXPORTER_OTLP_ENDPOINT` is read. Errors name the setting.
    pub(super) fn traces_url(base: &str) -> anyhow::Result<String> {
        let setting = "--otel-endpoint / ORDERLY_OTEL_ENDPOINT";
        let url = reqwest::Url::parse(base)
            .with_context(|| format!("invalid {setting} {base:?}: not a URL"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            anyhow::bail!(
                "invalid {setting} {base:?}: expected http(s)://HOST[:PORT][/PATH] of an OTLP/HTTP receiver"
            );
        }
        if url.query().is_some() || url.fragment().is_some() {
            anyhow::bail!("invalid {setting} {base:?}: no query or fragment expected");
        }
        Ok(format!("{}/v1/traces", base.trim_end_matches('/')))
    }

    /// The exporter's HTTP client: blocking (the batch exporter runs on a thread of
    /// its own), on orderly's one TLS stack and trust, with the standard
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` (ms, default 10 s). Built on a thread of its own, as
    /// a blocking client may not be built inside the async runtime.
    fn blocking_client() -> anyhow::Result<reqwest::blocking::Client> {
        let trust = orderly_tls::Trust::from_env()?;
        let config = trust.client_config()?;
        let timeout = std::env::var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_TIMEOUT"))
            .ok()
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .map_or(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_millis,
            );
        std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .tls_backend_preconfigured(config)
                // As every client of ours (orderly_tls::Trust::http_client): spans go
                // only where the endpoint says.
                .redirect(reqwest::redirect::Policy::none())
                .timeout(timeout)
                .build()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("building the OpenTelemetry exporter's HTTP client panicked"))?
        .context("cannot build the OpenTelemetry exporter's HTTP client")
    }

    pub(super) fn provider(
        service: &str,
        endpoint: Option<&str>,
        instance: &InstanceId,
    ) -> anyhow::Result<SdkTracerProvider> {
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(blocking_client()?)
            .with_protocol(Protocol::HttpBinary);
        if let Some(base) = endpoint {
            exporter = exporter.with_endpoint(traces_url(base)?);
        }
        let exporter = exporter
            .build()
            .context("cannot set up the OpenTelemetry exporter (OTEL_EXPORTER_OTLP_* settings)")?;
        let mut resource = Resource::builder().with_attributes([
            KeyValue::new("service.namespace", "orderly"),
            KeyValue::new("service.instance.id", instance.to_string()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ]);
        // OTEL_SERVICE_NAME or service.name in OTEL_RESOURCE_ATTRIBUTES win.
        let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|s| !s.is_empty())
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|s| s.contains("service.name="));
        if !named {
            resource = resource.with_service_name(service.to_owned());
        }
        Ok(SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build())
    }

    pub(super) fn layer(
        provider: &SdkTracerProvider,
    ) -> tracing_opentelemetry::OpenTelemetryLayer<Registry, opentelemetry_sdk::trace::SdkTracer>
    {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("orderly"))
            .with_tracked_inactivity(false)
    }

    /// W3C `traceparent` / `tracestate` in message properties.
    #[derive(Default)]
    pub(super) struct W3c(TraceContextPropagator);

    impl orderly_core::tracecontext::Propagator for W3c {
        fn inject(&self, span: &Span, properties: &mut BTreeMap<String, String>) {
            self.0
                .inject_context(&span.context(), &mut Props(properties));
        }

        fn adopt(&self, span: &Span, properties: Option<&BTreeMap<String, String>>) {
            let parent = match properties {
                Some(p) => self.0.extract(&PropsRef(p)),
                None => opentelemetry::Context::new(),
            };
            // Fails only for a span the layer does not see (filtered out): nothing to do.
            let _ = span.set_parent(parent);
        }
    }

    struct Props<'a>(&'a mut BTreeMap<String, String>);

    impl Injector for Props<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key.to_owned(), value);
        }
    }

    struct PropsRef<'a>(&'a BTreeMap<String, String>);

    impl Extractor for PropsRef<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).map(String::as_str)
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(String::as_str).collect()
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_endpoint_is_a_base_url_and_errors_name_the_setting() {
            assert_eq!(
                traces_url("http://collector:4318").unwrap(),
                "http://collector:4318/v1/traces"
            );
            assert_eq!(
                traces_url("https://otel.example.com/otlp/").unwrap(),
                "https://otel.example.com/otlp/v1/traces"
            );
            for bad in [
                "collector:4318",
                "ftp://collector",
                "http://",
                "http://c:4318/?a=1",
            ] {
                let e = traces_url(bad).unwrap_err().to_string();
                assert!(
                    e.contains("--otel-endpoint / ORDERLY_OTEL_ENDPOINT"),
                    "{bad}: {e}"
                );
            }
        }
    }
}
