//! Routing decisions for radixgate: workers, their load and health, and the
//! policies that choose a worker for a request. No HTTP lives here.
