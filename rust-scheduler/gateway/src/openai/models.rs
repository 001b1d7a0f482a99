//! The `/v1/models` body: the one model this gateway serves.

use serde::Serialize;
use utoipa::ToSchema;

#[derive(Serialize, ToSchema)]
pub struct ModelList<'a> {
    object: ListObject,
    /// Exactly one model: the one served.
    #[schema(min_items = 1, max_items = 1)]
    data: Vec<Model<'a>>,
}

#[derive(Serialize, ToSchema)]
struct Model<'a> {
    id: &'a str,
    object: ModelObject,
    created: u64,
    owned_by: &'static str,
}

#[derive(Serialize, ToSchema)]
enum ListObject {
    #[serde(rename = "list")]
    List,
}

#[derive(Serialize, ToSchema)]
enum ModelObject {
    #[serde(rename = "model")]
    Model,
}

impl<'a> ModelList<'a> {
    pub fn of(model: &'a str) -> Self {
        Self {
            object: ListObject::List,
            data: vec![Model {
                id: model,
                object: ModelObject::Model,
                created: 0,
                owned_by: "tiertp",
            }],
        }
    }
}
