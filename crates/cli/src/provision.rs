//! `orderly provision --print az`: what a deployment on Azure needs, as Azure CLI
//! commands, from the workflows it will run: the Service Bus namespace and each queue
//! the roles use (with the lock, deliveries and duplicate detection they rely on), the
//! storage account and container of the supervisors' lease, the PostgreSQL server and
//! database, the identity the supervisors take the lease with, and the Secret the
//! Kubernetes manifests read. It prints; it changes nothing.

use std::fmt::Write as _;
use std::time::Duration;

use orderly_core::messages::queues;
use orderly_core::transport::QueueName;
use orderly_core::workflow::Workflows;

/// What to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// A bash script of Azure CLI (`az`) commands.
    Az,
}

/// Names of what is provisioned.
#[derive(Debug, clap::Args)]
pub(crate) struct Names {
    /// The resource group everything goes in.
    #[arg(long, default_value = "orderly")]
    pub resource_group: String,
    /// The Azure region.
    #[arg(long, default_value = "westeurope")]
    pub location: String,
    /// The Service Bus namespace (globally unique: <name>.servicebus.windows.net).
    #[arg(long, default_value = "orderly-sb")]
    pub namespace: String,
    /// The storage account of the supervisors' lease (globally unique, 3-24 lower-case
    /// letters and digits).
    #[arg(long, default_value = "orderlyleases")]
    pub storage_account: String,
    /// The lease's container (ORDERLY_LEASE_CONTAINER).
    #[arg(long, default_value = "orderly-leases")]
    pub lease_container: String,
    /// The Azure Database for PostgreSQL flexible server (globally unique).
    #[arg(long, default_value = "orderly-pg")]
    pub postgres_server: String,
    /// The AKS cluster whose workload identity the supervisors use (its OIDC issuer is
    /// trusted for the Kubernetes service account orderly/orderly).
    #[arg(long, default_value = "orderly-aks")]
    pub aks_cluster: String,
}

/// The queues a deployment running `workflows` needs, in the order the roles name them.
pub(crate) fn needed_queues(workflows: &Workflows) -> Vec<QueueName> {
    let mut all = orderly_runtime::backend::fixed_queues();
    for q in workflows.queues() {
        if !all.contains(&q) {
            all.push(q);
        }
    }
    all
}

/// An ISO 8601 duration as Azure takes it: PT30S, PT10M, PT1H30M, P14D.
pub(crate) fn iso8601(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(86_400) {
        return format!("P{}D", s / 86_400);
    }
    let (h, m, sec) = (s / 3600, s % 3600 / 60, s % 60);
    let mut out = String::from("PT");
    if h > 0 {
        let _ = write!(out, "{h}H");
    }
    if m > 0 {
        let _ = write!(out, "{m}M");
    }
    if sec > 0 || out == "PT" {
        let _ = write!(out, "{sec}S");
    }
    out
}

/// How long a message waits in a queue before it expires: two weeks, far beyond any
/// order's deadline (an expired message is dead-lettered, not dropped).
const MESSAGE_TTL: Duration = Duration::from_secs(14 * 86_400);

/// The script.
pub(crate) fn az(workflows: &Workflows, n: &Names) -> String {
    let mut out = String::new();
    let mut line = |s: &str| {
        out.push_str(s);
        out.push('\n');
    };
    let versions: Vec<String> = workflows
        .references()
        .map(|r| format!("{}@{}", r.name, r.version))
        .collect();
    line("#!/usr/bin/env bash");
    line(&format!(
        "# orderly on Azure: what the roles need, for the workflows {}.",
        versions.join(", ")
    ));
    line(
        "# Printed by `orderly provision --print az`; review, then run it with the Azure CLI logged in.",
    );
    line(
        "# Secrets are read from the environment and never printed: set ORDERLY_PG_ADMIN_PASSWORD first.",
    );
    line("set -euo pipefail");
    line(&format!(
        "RG={} LOCATION={} NAMESPACE={} STORAGE={} CONTAINER={} PG={} AKS={}",
        n.resource_group,
        n.location,
        n.namespace,
        n.storage_account,
        n.lease_container,
        n.postgres_server,
        n.aks_cluster
    ));
    line(
        ": \"${ORDERLY_PG_ADMIN_PASSWORD:?set ORDERLY_PG_ADMIN_PASSWORD to the database's password}\"",
    );
    line("");
    line("az group create --name \"$RG\" --location \"$LOCATION\"");
    line("");
    line("# Service Bus (Standard: duplicate detection needs it). Queues are infrastructure:");
    line("# the roles never create them. Every queue detects duplicates (the outbox relay may");
    line("# publish a message twice); a message is dead-lettered after its deliveries run out.");
    line(
        "az servicebus namespace create --resource-group \"$RG\" --name \"$NAMESPACE\" --location \"$LOCATION\" --sku Standard --minimum-tls-version 1.2",
    );
    for q in needed_queues(workflows) {
        let s = queues::provisioned(&q);
        line(&format!(
            "az servicebus queue create --resource-group \"$RG\" --namespace-name \"$NAMESPACE\" --name {} \
             --lock-duration {} --max-delivery-count {} --enable-duplicate-detection {} \
             --duplicate-detection-history-time-window {} --default-message-time-to-live {} \
             --enable-dead-lettering-on-message-expiration true",
            q.as_str(),
            iso8601(s.lock_duration),
            s.max_delivery_count,
            !s.duplicate_detection_window.is_zero(),
            iso8601(s.duplicate_detection_window),
            iso8601(MESSAGE_TTL),
        ));
    }
    line(
        "# The roles' key (send and listen, no manage): its connection string goes in the Secret.",
    );
    line(
        "az servicebus namespace authorization-rule create --resource-group \"$RG\" --namespace-name \"$NAMESPACE\" --name orderly-roles --rights Send Listen",
    );
    line("");
    line("# The supervisors' lease: one blob in its own container, reached with an Entra ID");
    line("# token (no account key): the identity below may read and write that container only.");
    line(
        "az storage account create --resource-group \"$RG\" --name \"$STORAGE\" --location \"$LOCATION\" --sku Standard_LRS --kind StorageV2 --min-tls-version TLS1_2 --allow-blob-public-access false --allow-shared-key-access false",
    );
    line(
        "az storage container create --account-name \"$STORAGE\" --name \"$CONTAINER\" --auth-mode login",
    );
    line(
        "az identity create --resource-group \"$RG\" --name orderly-supervisor --location \"$LOCATION\"",
    );
    line("az role assignment create --role \"Storage Blob Data Contributor\" \\");
    line(
        "  --assignee-object-id \"$(az identity show --resource-group \"$RG\" --name orderly-supervisor --query principalId -o tsv)\" --assignee-principal-type ServicePrincipal \\",
    );
    line(
        "  --scope \"$(az storage account show --resource-group \"$RG\" --name \"$STORAGE\" --query id -o tsv)/blobServices/default/containers/$CONTAINER\"",
    );
    line(
        "# Workload identity: the pods of the service account orderly/orderly get that identity's tokens.",
    );
    line(
        "az identity federated-credential create --resource-group \"$RG\" --identity-name orderly-supervisor --name orderly-aks \\",
    );
    line(
        "  --issuer \"$(az aks show --resource-group \"$RG\" --name \"$AKS\" --query oidcIssuerProfile.issuerUrl -o tsv)\" \\",
    );
    line(
        "  --subject system:serviceaccount:orderly:orderly --audiences api://AzureADTokenExchange",
    );
    line("");
    line(&format!(
        "# PostgreSQL: TLS is required by the server (require_secure_transport, on by default) and \
         verified by the roles (sslmode=verify-full; Azure's certificates chain to public roots, \
         which the image trusts). Each role process holds up to {} connections.",
        orderly_sql::postgres::DEFAULT_MAX_CONNECTIONS
    ));
    line(
        "az postgres flexible-server create --resource-group \"$RG\" --name \"$PG\" --location \"$LOCATION\" --version 16 --tier GeneralPurpose --sku-name Standard_D2ds_v5 --storage-size 128 --admin-user orderly --admin-password \"$ORDERLY_PG_ADMIN_PASSWORD\" --public-access None",
    );
    line(
        "az postgres flexible-server parameter set --resource-group \"$RG\" --server-name \"$PG\" --name require_secure_transport --value on",
    );
    line(
        "az postgres flexible-server db create --resource-group \"$RG\" --server-name \"$PG\" --database-name orderly",
    );
    line("");
    line(
        "# What the manifests read (deploy/kubernetes): the Secret orderly-secrets. The tokens are new random values.",
    );
    line(
        "SB=\"$(az servicebus namespace authorization-rule keys list --resource-group \"$RG\" --namespace-name \"$NAMESPACE\" --name orderly-roles --query primaryConnectionString -o tsv)\"",
    );
    line("kubectl create namespace orderly --dry-run=client -o yaml | kubectl apply -f -");
    line("kubectl --namespace orderly create secret generic orderly-secrets \\");
    line(
        "  --from-literal=database-url=\"postgres://orderly:${ORDERLY_PG_ADMIN_PASSWORD}@${PG}.postgres.database.azure.com:5432/orderly?sslmode=verify-full\" \\",
    );
    line("  --from-literal=servicebus-connection=\"$SB\" \\");
    line(
        "  --from-literal=remote-url=\"${ORDERLY_REMOTE_URL:?set ORDERLY_REMOTE_URL to the remote services' base URL}\" \\",
    );
    line("  --from-literal=intake-token=\"$(openssl rand -hex 32)\" \\");
    line("  --from-literal=dashboard-token=\"$(openssl rand -hex 32)\" \\");
    line("  --from-literal=metrics-token=\"$(openssl rand -hex 32)\"");
    line(
        "echo \"set azure.workload.identity/client-id in deploy/kubernetes/base/identity.yaml to: $(az identity show --resource-group \"$RG\" --name orderly-supervisor --query clientId -o tsv)\"",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_as_azure_takes_them() {
        for (secs, text) in [
            (30, "PT30S"),
            (600, "PT10M"),
            (3600, "PT1H"),
            (5430, "PT1H30M30S"),
            (14 * 86_400, "P14D"),
            (0, "PT0S"),
        ] {
            assert_eq!(iso8601(Duration::from_secs(secs)), text);
        }
    }
}
