//! Engine metrics scraping: a background thread GETs each traced engine's own metrics endpoint
//! (on one of the ports it listens on) every interval and hands the raw bodies to the pipeline
//! thread through a bounded channel. The pipeline never waits on an engine's HTTP server.
pub(crate) mod http;
mod scraper;

pub(crate) use scraper::{MetricsScraper, Scrape, ScrapeConfig};
