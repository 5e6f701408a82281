//! The session engine shared by multi-turn chat and agentic workloads.
//!
//! A session opens with a few messages, sends them, waits for the reply,
//! appends the reply as the assistant's message plus the script's next
//! message, pauses (think time, tool time) and sends the grown context again,
//! for a fixed number of turns. Due follow-ups are served before new
//! sessions are opened, oldest due first, so the mix of turns stays as the
//! script says whatever the arrival process.
//!
//! Invariants: a session has at most one request in flight; `awaiting`
//! counts sessions with a request in flight; a session is forgotten after its
//! last turn's reply or after a failure.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use super::{Message, Poll, Prompt, RequestSpec, Role, SessionId};

/// What a session-based workload says at each step.
pub(super) trait Script: Send {
    /// The group and opening messages of new session `session`.
    fn open(&self, session: SessionId) -> (u64, Vec<Message>);
    /// The message that follows the reply to turn `turn` (1-based).
    fn follow_up(&self, session: SessionId, turn: u32) -> Message;
    /// The pause after the reply to turn `turn` before the next turn.
    fn pause(&self, session: SessionId, turn: u32) -> Duration;
    /// Requests per session.
    fn turns(&self) -> u32;
    /// Tokens to generate per request.
    fn max_tokens(&self) -> u32;
}

#[derive(Debug)]
struct Session {
    group: u64,
    messages: Vec<Message>,
    turns_done: u32,
    in_flight: bool,
}

/// Drives sessions of a [`Script`].
#[derive(Debug)]
pub(super) struct Conversations<S> {
    script: S,
    /// Sessions to open in all; 0 = unlimited.
    limit: u64,
    started: u64,
    seq: u64,
    order: u64,
    awaiting: u64,
    live: HashMap<SessionId, Session>,
    due: BinaryHeap<Reverse<(Duration, u64, SessionId)>>,
}

impl<S: Script> Conversations<S> {
    pub(super) fn new(script: S, limit: u64) -> Self {
        Self {
            script,
            limit,
            started: 0,
            seq: 0,
            order: 0,
            awaiting: 0,
            live: HashMap::new(),
            due: BinaryHeap::new(),
        }
    }

    pub(super) fn script(&self) -> &S {
        &self.script
    }

    fn emit(&mut self, session: SessionId) -> Poll {
        let Some(s) = self.live.get_mut(&session) else {
            return Poll::AwaitReply;
        };
        s.in_flight = true;
        self.awaiting += 1;
        let seq = self.seq;
        self.seq += 1;
        Poll::Ready(RequestSpec {
            seq,
            session,
            group: s.group,
            arrival: None,
            prompt: Prompt::Chat(s.messages.clone()),
            max_tokens: self.script.max_tokens(),
            wants_reply: s.turns_done + 1 < self.script.turns(),
        })
    }

    pub(super) fn next(&mut self, now: Duration) -> Poll {
        if let Some(Reverse((t, _, session))) = self.due.peek().copied()
            && t <= now
        {
            self.due.pop();
            return self.emit(session);
        }
        if self.limit == 0 || self.started < self.limit {
            let session = self.started;
            self.started += 1;
            let (group, messages) = self.script.open(session);
            self.live.insert(
                session,
                Session {
                    group,
                    messages,
                    turns_done: 0,
                    in_flight: false,
                },
            );
            return self.emit(session);
        }
        if let Some(Reverse((t, _, _))) = self.due.peek() {
            return Poll::NotBefore(*t);
        }
        if self.awaiting > 0 {
            Poll::AwaitReply
        } else {
            Poll::Done
        }
    }

    pub(super) fn on_reply(&mut self, session: SessionId, reply: &str, now: Duration) {
        let turns = self.script.turns();
        let Some(s) = self.live.get_mut(&session) else {
            return;
        };
        if !s.in_flight {
            return;
        }
        s.in_flight = false;
        self.awaiting -= 1;
        s.turns_done += 1;
        if s.turns_done >= turns {
            self.live.remove(&session);
            return;
        }
        let turn = s.turns_done;
        s.messages.push(Message::new(Role::Assistant, reply));
        s.messages.push(self.script.follow_up(session, turn));
        let at = now + self.script.pause(session, turn);
        self.due.push(Reverse((at, self.order, session)));
        self.order += 1;
    }

    pub(super) fn on_failure(&mut self, session: SessionId) {
        if self.live.get(&session).is_some_and(|s| s.in_flight) {
            self.awaiting -= 1;
            self.live.remove(&session);
        }
    }
}
