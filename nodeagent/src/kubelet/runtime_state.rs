//! The kubelet's runtime state (its `runtimeState`, kept by `updateRuntimeUp`): whether the
//! container runtime and the runtime's network are ready, from the CRI `Status` call made every
//! [`CHECK_PERIOD`] (and at once when a relist of the runtime fails), and the node's Ready
//! condition that follows from it: `KubeletNotReady` with the kubelet's messages while either is
//! not.

use crate::kubelet::cri::pb::RuntimeCondition;
use crate::kubelet::runtime::RuntimeManager;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How often the runtime is asked (the kubelet's `updateRuntimeUp` runs every 5 s); a call that
/// takes longer counts as a runtime that is down.
pub const CHECK_PERIOD: Duration = Duration::from_secs(5);

/// What the node knows of its runtime. The default is a ready runtime: the agent starts once
/// the runtime has answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeState {
    /// Why the runtime cannot run Pods, if it cannot.
    pub runtime: Option<String>,
    /// Why the runtime's network is not ready, if it is not.
    pub network: Option<String>,
}

impl RuntimeState {
    /// The state after a `Status` call: its conditions, or the call's failure (the runtime is
    /// down; what is known of its network stays as it was, as the kubelet keeps it).
    pub fn observed(&self, status: Result<&[RuntimeCondition], String>) -> RuntimeState {
        let conditions = match status {
            Ok(conditions) => conditions,
            Err(_) => {
                return RuntimeState {
                    runtime: Some("container runtime is down".into()),
                    network: self.network.clone(),
                };
            }
        };
        let find = |type_: &str| conditions.iter().find(|c| c.r#type == type_);
        let not_ready = |type_: &str, what: &str| {
            let condition = find(type_);
            (!condition.is_some_and(|c| c.status)).then(|| format!("{what}: {}", describe(type_, condition)))
        };
        RuntimeState {
            runtime: not_ready("RuntimeReady", "container runtime not ready"),
            network: not_ready("NetworkReady", "container runtime network not ready"),
        }
    }

    /// Why the node cannot run Pods, as the kubelet aggregates its errors: one alone, several
    /// as `[a, b]`; `None` when it can.
    pub fn message(&self) -> Option<String> {
        let errors: Vec<&str> = [&self.runtime, &self.network].into_iter().flatten().map(String::as_str).collect();
        match errors.as_slice() {
            [] => None,
            [one] => Some((*one).to_owned()),
            many => Some(format!("[{}]", many.join(", "))),
        }
    }
}

/// A runtime condition as the kubelet prints it (`NetworkReady=false reason:… message:…`).
fn describe(type_: &str, condition: Option<&RuntimeCondition>) -> String {
    match condition {
        Some(c) => format!("{}={} reason:{} message:{}", c.r#type, c.status, c.reason, c.message),
        None => format!("{type_} not reported"),
    }
}

/// The node's Ready condition for `state`. Its times stay those of `previous` while its status
/// holds, so an unchanged node reports an unchanged condition (and writes nothing).
pub fn ready_condition(state: &RuntimeState, previous: Option<&NodeCondition>, now: Time) -> NodeCondition {
    let (status, reason, message) = match state.message() {
        None => ("True", "KubeletReady", "kubelet is posting ready status".to_owned()),
        Some(message) => ("False", "KubeletNotReady", message),
    };
    let since = previous.filter(|p| p.status == status).and_then(|p| p.last_transition_time.clone()).unwrap_or(now);
    NodeCondition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_heartbeat_time: Some(since.clone()),
        last_transition_time: Some(since),
    }
}

/// Asks the runtime every [`CHECK_PERIOD`], or at once when `check_now` is notified, and
/// publishes what changed.
pub async fn run(runtime: Arc<RuntimeManager>, state: watch::Sender<RuntimeState>, check_now: Arc<Notify>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_PERIOD) => {}
            _ = check_now.notified() => {}
        }
        let status = runtime.status(CHECK_PERIOD).await;
        let next = state.borrow().observed(status.as_deref().map_err(|e| e.to_string()));
        state.send_if_modified(|current| {
            if *current == next {
                return false;
            }
            match (next.message(), &status) {
                (None, _) => tracing::info!("the container runtime is ready"),
                (Some(why), Err(error)) => tracing::warn!(%why, %error, "the container runtime is not ready"),
                (Some(why), Ok(_)) => tracing::warn!(%why, "the container runtime is not ready"),
            }
            *current = next;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn condition(type_: &str, status: bool, reason: &str, message: &str) -> RuntimeCondition {
        RuntimeCondition { r#type: type_.into(), status, reason: reason.into(), message: message.into() }
    }

    #[test]
    fn the_kubelets_reasons() {
        let ready = [condition("RuntimeReady", true, "", ""), condition("NetworkReady", true, "", "")];
        let up = RuntimeState::default().observed(Ok(&ready));
        assert_eq!(up, RuntimeState::default());
        assert_eq!(up.message(), None);

        let no_cni = [
            condition("RuntimeReady", true, "", ""),
            condition("NetworkReady", false, "NetworkPluginNotReady", "cni config uninitialized"),
        ];
        let network = up.observed(Ok(&no_cni));
        assert_eq!(
            network.message().as_deref(),
            Some(
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady \
                 message:cni config uninitialized"
            )
        );

        // A failed call: the runtime is down, the network as last known.
        let down = network.observed(Err("connection refused".into()));
        assert_eq!(down.runtime.as_deref(), Some("container runtime is down"));
        assert_eq!(down.network, network.network);
        assert!(down.message().is_some_and(|m| m.starts_with("[container runtime is down, container runtime network")));
        assert_eq!(
            RuntimeState::default().observed(Err("refused".into())).message().as_deref(),
            Some("container runtime is down")
        );

        // A runtime that reports no conditions is not ready.
        let silent = RuntimeState::default().observed(Ok(&[]));
        assert_eq!(silent.runtime.as_deref(), Some("container runtime not ready: RuntimeReady not reported"));
    }

    #[test]
    fn the_ready_condition_keeps_its_times_while_it_holds() {
        let (then, now) = (Time(Timestamp::UNIX_EPOCH), Time(Timestamp::now()));
        let down = RuntimeState { runtime: Some("container runtime is down".into()), network: None };
        let first = ready_condition(&down, None, then.clone());
        assert_eq!((first.status.as_str(), first.reason.as_deref()), ("False", Some("KubeletNotReady")));
        assert_eq!(first.message.as_deref(), Some("container runtime is down"));
        assert_eq!(ready_condition(&down, Some(&first), now.clone()), first);
        let up = ready_condition(&RuntimeState::default(), Some(&first), now.clone());
        assert_eq!((up.status.as_str(), up.reason.as_deref()), ("True", Some("KubeletReady")));
        assert_eq!(up.last_transition_time, Some(now));
    }
}
