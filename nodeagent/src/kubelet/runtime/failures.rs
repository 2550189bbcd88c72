//! Why containers wait, remembered between syncs, and the image pull back-off (kubelet's image
//! manager: per pod and image, 10 s doubling to 5 min). Pure: the caller passes the time.
//!
//! Every waiting message is built from what just happened, never from the previous message: a
//! message that grew with each sync once made every sync a new status to write.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::status::Waiting;

/// kubelet's `backOffPeriod` and `MaxContainerBackOff` for image pulls.
const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The wait after the `failures`-th failed pull in a row (1-based): 10 s, 20 s, … 300 s.
pub fn pull_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    (PULL_BACKOFF_INITIAL * (1 << doublings)).min(PULL_BACKOFF_MAX)
}

/// The waiting reason after a failed pull: the runtime's message, as kubelet shows it.
pub fn err_image_pull(message: &str) -> Waiting {
    Waiting { reason: "ErrImagePull".into(), message: message.to_owned() }
}

/// The waiting reason while a pull backs off: kubelet's message, quoting the last pull's error.
pub fn image_pull_back_off(image: &str, pull_error: &str) -> Waiting {
    Waiting {
        reason: "ImagePullBackOff".into(),
        message: format!("Back-off pulling image {image:?}: ErrImagePull: {pull_error}"),
    }
}

#[derive(Clone, Debug)]
struct Failure {
    waiting: Waiting,
    image: String,
    pulls: Option<FailedPulls>,
}

/// The failed pulls of a container's image, in a row.
#[derive(Clone, Debug)]
struct FailedPulls {
    count: u32,
    /// The runtime's message of the last one.
    error: String,
    retry_at: Instant,
}

/// pod uid -> container name -> why it waits.
#[derive(Debug, Default)]
pub struct Failures {
    pods: HashMap<String, HashMap<String, Failure>>,
}

/// A runtime's error without the ephemeral source ports it quotes (`read udp
/// 10.0.0.5:41234->10.0.0.1:53`): each attempt's message is then the same, so its Events count
/// on one instead of a new Event per attempt.
pub fn without_source_ports(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for (i, part) in message.split("->").enumerate() {
        if i > 0 {
            out.push_str("->");
        }
        let is_last = i + 1 == message.split("->").count();
        let cut = match part.rsplit_once(':') {
            Some((host, port)) if !is_last && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => part,
        };
        out.push_str(cut);
    }
    out
}

impl Failures {
    /// Container `name` waits for a reason other than its image pull; a pull back-off of the
    /// same image is kept.
    pub fn record(&mut self, uid: &str, name: &str, image: &str, waiting: Waiting) {
        let pulls = self.pulls(uid, name, image).cloned();
        self.set(uid, name, Failure { waiting, image: image.to_owned(), pulls });
    }

    /// A pull of `image` failed with `error` at `now`: ErrImagePull, and the back-off grows.
    pub fn pull_failed(&mut self, uid: &str, name: &str, image: &str, error: &str, now: Instant) -> Waiting {
        let count = self.pulls(uid, name, image).map_or(0, |p| p.count) + 1;
        let waiting = err_image_pull(error);
        let pulls = FailedPulls { count, error: error.to_owned(), retry_at: now + pull_backoff(count) };
        self.set(uid, name, Failure { waiting: waiting.clone(), image: image.to_owned(), pulls: Some(pulls) });
        waiting
    }

    /// ImagePullBackOff while the back-off after the last failed pull of `image` lasts; `None`
    /// when a pull may start.
    pub fn backing_off(&mut self, uid: &str, name: &str, image: &str, now: Instant) -> Option<Waiting> {
        let pulls = self.pulls(uid, name, image).filter(|p| now < p.retry_at)?;
        let waiting = image_pull_back_off(image, &pulls.error);
        self.record(uid, name, image, waiting.clone());
        Some(waiting)
    }

    /// Container `name` started: it waits for nothing.
    pub fn forget(&mut self, uid: &str, name: &str) {
        if let Some(slot) = self.pods.get_mut(uid) {
            slot.remove(name);
            if slot.is_empty() {
                self.pods.remove(uid);
            }
        }
    }

    pub fn forget_pod(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// Why each waiting container of pod `uid` waits.
    pub fn waiting(&self, uid: &str) -> HashMap<String, Waiting> {
        self.pods
            .get(uid)
            .map(|slot| slot.iter().map(|(name, f)| (name.clone(), f.waiting.clone())).collect())
            .unwrap_or_default()
    }

    /// Why container `name` of pod `uid` waits now, if it does.
    pub fn reason(&self, uid: &str, name: &str) -> Option<String> {
        Some(self.pods.get(uid)?.get(name)?.waiting.reason.clone())
    }

    fn pulls(&self, uid: &str, name: &str, image: &str) -> Option<&FailedPulls> {
        self.pods.get(uid)?.get(name).filter(|f| f.image == image)?.pulls.as_ref()
    }

    fn set(&mut self, uid: &str, name: &str, failure: Failure) {
        self.pods.entry(uid.to_owned()).or_default().insert(name.to_owned(), failure);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ports_are_left_out_of_messages() {
        let message = "failed to resolve reference: dial tcp: lookup registry.example on 10.0.0.1:53: read udp \
                       10.0.0.5:41234->10.0.0.1:53: i/o timeout";
        assert_eq!(
            without_source_ports(message),
            "failed to resolve reference: dial tcp: lookup registry.example on 10.0.0.1:53: read udp \
             10.0.0.5->10.0.0.1:53: i/o timeout"
        );
        assert_eq!(without_source_ports("[fd00::5]:5353->[fd00::1]:53"), "[fd00::5]->[fd00::1]:53");
        assert_eq!(without_source_ports("no arrows: 10.0.0.1:53"), "no arrows: 10.0.0.1:53");
    }

    const IMAGE: &str = "nginx:1.27";
    const ERROR: &str = "failed to resolve reference \"docker.io/library/nginx:1.27\": network is unreachable";

    #[test]
    fn back_off_follows_the_kubelet() {
        let waits: Vec<u64> = (1..=8).map(|n| pull_backoff(n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(pull_backoff(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn pulls_alternate_with_back_off_and_messages_stay_the_same() {
        let mut failures = Failures::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut pulls = Vec::new();
        let mut messages = std::collections::BTreeSet::new();
        let mut changes = 0;
        // Ten minutes of syncs every 2 s, as the pod worker's resync.
        while now < t0 + Duration::from_secs(600) {
            let before = failures.reason("u", "web");
            let waiting = match failures.backing_off("u", "web", IMAGE, now) {
                Some(waiting) => waiting,
                None => {
                    pulls.push((now - t0).as_secs());
                    failures.pull_failed("u", "web", IMAGE, ERROR, now)
                }
            };
            assert_eq!(failures.waiting("u").get("web"), Some(&waiting));
            changes += usize::from(before.as_deref() != Some(waiting.reason.as_str()));
            messages.insert((waiting.reason, waiting.message));
            now += Duration::from_secs(2);
        }
        assert_eq!(pulls, [0, 10, 30, 70, 150, 310]);
        // What the agent logs: each change of reason (a pull, then its back-off), not each sync.
        assert_eq!(changes, 2 * pulls.len());
        let expected = [
            ("ErrImagePull".to_owned(), ERROR.to_owned()),
            ("ImagePullBackOff".to_owned(), format!("Back-off pulling image \"nginx:1.27\": ErrImagePull: {ERROR}")),
        ];
        assert_eq!(messages.into_iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn another_image_starts_over_and_other_reasons_keep_the_back_off() {
        let mut failures = Failures::default();
        let now = Instant::now();
        failures.pull_failed("u", "web", IMAGE, ERROR, now);
        failures.pull_failed("u", "web", IMAGE, ERROR, now);
        let config = Waiting { reason: "CreateContainerConfigError".into(), message: "bad".into() };
        failures.record("u", "web", IMAGE, config.clone());
        assert_eq!(failures.waiting("u").get("web"), Some(&config));
        assert!(failures.backing_off("u", "web", IMAGE, now + Duration::from_secs(19)).is_some());
        assert!(failures.backing_off("u", "web", IMAGE, now + Duration::from_secs(20)).is_none());
        assert!(failures.backing_off("u", "web", "nginx:1.28", now).is_none(), "a new image pulls at once");
        failures.forget("u", "web");
        assert!(failures.waiting("u").is_empty());
        assert!(failures.backing_off("u", "web", IMAGE, now).is_none());
    }
}
