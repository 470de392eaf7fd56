pub mod ca;
pub mod roots;
