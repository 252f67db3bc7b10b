//! `orderly provision --print az`: what a deployment on Azure needs, as Azure CLI
//! commands, from the workflows it will run: the Service Bus namespace and each queue
//! the roles use (with the lock, deliveries and duplicate detection they rely on), the
//! storage account and container of the supervisors' lease, the PostgreSQL server and
//! database, the identity the roles reach Service Bus and the lease with (workload
//! identity: no key), KEDA's, and the Secret the Kubernetes manifests read. It prints;
//! it changes nothing.

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
    /// The AKS cluster whose workload identity the roles use (its OIDC issuer is
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

/// The script's helpers: existence checks, role grants that look before they assign,
/// and a Secret value kept across runs.
const HELPERS: &str = r#"# True when what `az ... show` names exists (a second run skips its create).
exists() { "$@" --output none >/dev/null 2>&1; }
# ROLE to PRINCIPAL on SCOPE, unless that assignment exists.
grant() {
  if [ -z "$(az role assignment list --assignee "$2" --role "$1" --scope "$3" --query '[0].id' -o tsv)" ]; then
    az role assignment create --role "$1" --assignee-object-id "$2" --assignee-principal-type ServicePrincipal --scope "$3" --output none
  fi
}
# The Secret's value under key $1 if the Secret has one, else a new random token: a
# second run keeps the tokens clients already hold (delete the Secret for new ones).
kept_or_new() {
  local v
  v="$(kubectl --namespace orderly get secret orderly-secrets -o "jsonpath={.data.$1}" 2>/dev/null | base64 --decode 2>/dev/null || true)"
  if [ -n "$v" ]; then printf '%s' "$v"; else openssl rand -hex 32; fi
}
"#;

/// The script: every resource created before anything reads it, each step safe to run
/// again (a create that Azure treats as create-or-update, or an existence check first).
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
    line("# Printed by `orderly provision --print az`; review, then run it with the Azure CLI");
    line("# logged in (az login) and kubectl installed. Every step may run again: a second run");
    line("# creates nothing new and keeps the Secret's tokens.");
    line("# No key or password anywhere: the roles reach Service Bus, the lease and PostgreSQL");
    line("# with Entra ID tokens of the identity orderly-roles (workload identity), KEDA with");
    line("# its own. Run it as a user who may assign roles (Owner or User Access Administrator");
    line("# on the group). Set ORDERLY_REMOTE_URL first.");
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
        ": \"${ORDERLY_REMOTE_URL:?set ORDERLY_REMOTE_URL to the base URL of the remote services}\"",
    );
    out.push_str(HELPERS);
    let mut line = |s: &str| {
        out.push_str(s);
        out.push('\n');
    };
    line("");
    line("az group create --name \"$RG\" --location \"$LOCATION\" --output none");
    line("");
    line("# The cluster: AKS with its OIDC issuer and workload identity (pods get Entra ID tokens");
    line("# for their service account) and the KEDA add-on (the ScaledObjects). An existing");
    line("# cluster gets what it lacks.");
    line("if ! exists az aks show --resource-group \"$RG\" --name \"$AKS\"; then");
    line(
        "  az aks create --resource-group \"$RG\" --name \"$AKS\" --location \"$LOCATION\" --node-count 2 --node-vm-size Standard_D2ds_v5 --enable-oidc-issuer --enable-workload-identity --enable-keda --no-ssh-key --output none",
    );
    line("fi");
    for (query, flag) in [
        ("oidcIssuerProfile.enabled", "--enable-oidc-issuer"),
        (
            "securityProfile.workloadIdentity.enabled",
            "--enable-workload-identity",
        ),
        ("workloadAutoScalerProfile.keda.enabled", "--enable-keda"),
    ] {
        line(&format!(
            "if [ \"$(az aks show --resource-group \"$RG\" --name \"$AKS\" --query {query} -o tsv)\" != true ]; then"
        ));
        line(&format!(
            "  az aks update --resource-group \"$RG\" --name \"$AKS\" {flag} --output none"
        ));
        line("fi");
    }
    line("az aks get-credentials --resource-group \"$RG\" --name \"$AKS\" --overwrite-existing");
    line(
        "ISSUER=\"$(az aks show --resource-group \"$RG\" --name \"$AKS\" --query oidcIssuerProfile.issuerUrl -o tsv)\"",
    );
    line("");
    line("# Service Bus (Standard: duplicate detection needs it). Queues are infrastructure:");
    line("# the roles never create them. Every queue detects duplicates (the outbox relay may");
    line("# publish a message twice); a message is dead-lettered after its deliveries run out.");
    line("# Each create is a create-or-update: a second run changes nothing. No key: local");
    line("# (SAS) authentication is off; the roles and KEDA come with Entra ID tokens.");
    line(
        "az servicebus namespace create --resource-group \"$RG\" --name \"$NAMESPACE\" --location \"$LOCATION\" --sku Standard --minimum-tls-version 1.2 --disable-local-auth true --output none",
    );
    for q in needed_queues(workflows) {
        let s = queues::provisioned(&q);
        line(&format!(
            "az servicebus queue create --resource-group \"$RG\" --namespace-name \"$NAMESPACE\" --name {} \
             --lock-duration {} --max-delivery-count {} --enable-duplicate-detection {} \
             --duplicate-detection-history-time-window {} --default-message-time-to-live {} \
             --enable-dead-lettering-on-message-expiration true --output none",
            q.as_str(),
            iso8601(s.lock_duration),
            s.max_delivery_count,
            !s.duplicate_detection_window.is_zero(),
            iso8601(s.duplicate_detection_window),
            iso8601(MESSAGE_TTL),
        ));
    }
    line(
        "SB_ID=\"$(az servicebus namespace show --resource-group \"$RG\" --name \"$NAMESPACE\" --query id -o tsv)\"",
    );
    line("");
    line("# The supervisors' lease: one blob in its own container, reached with an Entra ID");
    line("# token (no account key). The container is made through the control plane");
    line("# (container-rm), which needs no data role of the deployer.");
    line(
        "az storage account create --resource-group \"$RG\" --name \"$STORAGE\" --location \"$LOCATION\" --sku Standard_LRS --kind StorageV2 --min-tls-version TLS1_2 --allow-blob-public-access false --allow-shared-key-access false --output none",
    );
    line(
        "az storage container-rm create --resource-group \"$RG\" --storage-account \"$STORAGE\" --name \"$CONTAINER\" --output none",
    );
    line(
        "CONTAINER_ID=\"$(az storage account show --resource-group \"$RG\" --name \"$STORAGE\" --query id -o tsv)/blobServices/default/containers/$CONTAINER\"",
    );
    line("");
    line("# Identities, each with the least it needs, trusted for one Kubernetes service account");
    line("# (workload identity, after the cluster's issuer exists): the roles' may send to and");
    line("# receive from the namespace's queues (no manage) and read and write the lease");
    line("# container only; KEDA's reads queue depths (the Service Bus scaler needs Data Owner");
    line("# on the namespace). KEDA's operator also takes the roles' identity to count the orders");
    line("# waiting in PostgreSQL (as their PostgreSQL role; a reader of its own would need SQL");
    line("# run by an administrator).");
    line(
        "az identity create --resource-group \"$RG\" --name orderly-roles --location \"$LOCATION\" --output none",
    );
    line(
        "az identity create --resource-group \"$RG\" --name orderly-keda --location \"$LOCATION\" --output none",
    );
    line(
        "ROLES_PRINCIPAL=\"$(az identity show --resource-group \"$RG\" --name orderly-roles --query principalId -o tsv)\"",
    );
    line(
        "KEDA_PRINCIPAL=\"$(az identity show --resource-group \"$RG\" --name orderly-keda --query principalId -o tsv)\"",
    );
    line("grant \"Storage Blob Data Contributor\" \"$ROLES_PRINCIPAL\" \"$CONTAINER_ID\"");
    line("grant \"Azure Service Bus Data Sender\" \"$ROLES_PRINCIPAL\" \"$SB_ID\"");
    line("grant \"Azure Service Bus Data Receiver\" \"$ROLES_PRINCIPAL\" \"$SB_ID\"");
    line("grant \"Azure Service Bus Data Owner\" \"$KEDA_PRINCIPAL\" \"$SB_ID\"");
    line(
        "az identity federated-credential create --resource-group \"$RG\" --identity-name orderly-roles --name orderly-aks \
         --issuer \"$ISSUER\" --subject system:serviceaccount:orderly:orderly --audiences api://AzureADTokenExchange --output none",
    );
    line(
        "az identity federated-credential create --resource-group \"$RG\" --identity-name orderly-roles --name keda-operator \
         --issuer \"$ISSUER\" --subject system:serviceaccount:kube-system:keda-operator --audiences api://AzureADTokenExchange --output none",
    );
    line(
        "az identity federated-credential create --resource-group \"$RG\" --identity-name orderly-keda --name keda-operator \
         --issuer \"$ISSUER\" --subject system:serviceaccount:kube-system:keda-operator --audiences api://AzureADTokenExchange --output none",
    );
    line("");
    line(&format!(
        "# PostgreSQL: TLS is required by the server (require_secure_transport) and verified by \
         the roles (sslmode=verify-full; Azure's certificates chain to public roots, which the \
         image trusts). Each role process holds up to {} connections. Reached over its public \
         endpoint from the cluster's egress address only (a firewall rule: it works with any \
         AKS network; for a private one, create the server with --vnet/--subnet in the \
         cluster's virtual network instead).",
        orderly_sql::postgres::DEFAULT_MAX_CONNECTIONS
    ));
    line("# No password: Microsoft Entra authentication only. The roles' identity is the server's");
    line("# Entra ID administrator, so the server makes its PostgreSQL role, orderly-roles, which");
    line("# the roles sign in as with a token (ORDERLY_DATABASE_CREDENTIAL); they run the");
    line("# migrations and own what those create. The server holds orderly's database only, so");
    line("# that reach is this deployment's (a narrower role: docs/containers.md).");
    line(
        "if ! exists az postgres flexible-server show --resource-group \"$RG\" --name \"$PG\"; then",
    );
    line(
        "  az postgres flexible-server create --resource-group \"$RG\" --name \"$PG\" --location \"$LOCATION\" --version 16 --tier GeneralPurpose --sku-name Standard_D2ds_v5 --storage-size 128 --microsoft-entra-auth Enabled --password-auth Disabled --admin-display-name orderly-roles --admin-object-id \"$ROLES_PRINCIPAL\" --admin-type ServicePrincipal --public-access None --yes --output none",
    );
    line("fi");
    line("# A server made before gets the roles' identity as an administrator too.");
    line(
        "if ! exists az postgres flexible-server microsoft-entra-admin show --resource-group \"$RG\" --server-name \"$PG\" --object-id \"$ROLES_PRINCIPAL\"; then",
    );
    line(
        "  az postgres flexible-server microsoft-entra-admin create --resource-group \"$RG\" --server-name \"$PG\" --display-name orderly-roles --object-id \"$ROLES_PRINCIPAL\" --type ServicePrincipal --output none",
    );
    line("fi");
    line(
        "az postgres flexible-server parameter set --resource-group \"$RG\" --server-name \"$PG\" --name require_secure_transport --value on --output none",
    );
    line(
        "EGRESS_ID=\"$(az aks show --resource-group \"$RG\" --name \"$AKS\" --query 'networkProfile.loadBalancerProfile.effectiveOutboundIPs[0].id' -o tsv)\"",
    );
    line(
        "EGRESS_IP=\"$(az network public-ip show --ids \"$EGRESS_ID\" --query ipAddress -o tsv)\"",
    );
    line(
        "az postgres flexible-server firewall-rule create --resource-group \"$RG\" --server-name \"$PG\" --name aks-egress --start-ip-address \"$EGRESS_IP\" --end-ip-address \"$EGRESS_IP\" --output none",
    );
    line(
        "if ! exists az postgres flexible-server db show --resource-group \"$RG\" --server-name \"$PG\" --name orderly; then",
    );
    line(
        "  az postgres flexible-server db create --resource-group \"$RG\" --server-name \"$PG\" --name orderly --output none",
    );
    line("fi");
    line("");
    line("# KEDA's operator takes the identity its TriggerAuthentication names (identityId) once");
    line("# restarted after the federated credential exists.");
    line(
        "KEDA_CLIENT=\"$(az identity show --resource-group \"$RG\" --name orderly-keda --query clientId -o tsv)\"",
    );
    line("kubectl --namespace kube-system rollout restart deployment keda-operator");
    line("");
    line(
        "# What the manifests read (deploy/kubernetes): the Secret orderly-secrets, applied (a second run",
    );
    line("# updates it in place; its tokens are kept).");
    line("kubectl create namespace orderly --dry-run=client -o yaml | kubectl apply -f -");
    line(
        "INTAKE_TOKEN=\"$(kept_or_new intake-token)\" DASHBOARD_TOKEN=\"$(kept_or_new dashboard-token)\" METRICS_TOKEN=\"$(kept_or_new metrics-token)\"",
    );
    line("kubectl --namespace orderly create secret generic orderly-secrets \\");
    line(
        "  --from-literal=database-url=\"postgres://orderly-roles@${PG}.postgres.database.azure.com:5432/orderly?sslmode=verify-full\" \\",
    );
    line("  --from-literal=remote-url=\"$ORDERLY_REMOTE_URL\" \\");
    line("  --from-literal=intake-token=\"$INTAKE_TOKEN\" \\");
    line("  --from-literal=dashboard-token=\"$DASHBOARD_TOKEN\" \\");
    line("  --from-literal=metrics-token=\"$METRICS_TOKEN\" \\");
    line("  --dry-run=client -o yaml | kubectl apply -f -");
    line(
        "echo \"Your overlay (a copy of deploy/kubernetes/example, docs/containers.md) takes these values:\"",
    );
    line(
        "echo \"  the ServiceAccount's azure.workload.identity/client-id: $(az identity show --resource-group \"$RG\" --name orderly-roles --query clientId -o tsv)\"",
    );
    line("echo \"  the TriggerAuthentication orderly-servicebus's identityId: $KEDA_CLIENT\"");
    line(
        "echo \"  the TriggerAuthentication orderly-postgresql's identityId: the client id of orderly-roles (above); the PostgreSQL host: $PG.postgres.database.azure.com\"",
    );
    line("echo \"  ORDERLY_LEASE_ACCOUNT_URL: https://$STORAGE.blob.core.windows.net\"");
    line(
        "echo \"  the Service Bus namespace: $NAMESPACE (ORDERLY_SERVICEBUS_NAMESPACE: $NAMESPACE.servicebus.windows.net)\"",
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
